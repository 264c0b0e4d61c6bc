from __future__ import annotations

from django.apps import AppConfig


class DjappConfig(AppConfig):
    name = "bench.peers.runners.djapp"
    label = "djapp"
    default_auto_field = "django.db.models.BigAutoField"
