"""The business row every transaction writes, and the row a consumer's handler writes."""

from __future__ import annotations

import os

from django.db import models

PREFIX = os.environ.get("CKIT_PEERS_PREFIX", "bench_peers")


class Order(models.Model):
    sku = models.CharField(max_length=64)
    qty = models.IntegerField()

    class Meta:
        app_label = "djapp"
        db_table = f"{PREFIX}_orders"


class Effect(models.Model):
    sku = models.CharField(max_length=64)
    qty = models.IntegerField()

    class Meta:
        app_label = "djapp"
        db_table = f"{PREFIX}_effects"
