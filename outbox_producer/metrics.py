"""Prometheus metrics of the producer half (registered once, in the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SENT = Counter("ckit_outbox_sent", "Outbox messages the broker accepted")
RETRIED = Counter("ckit_outbox_send_retries", "Failed sends scheduled for a retry")
FAILED = Counter("ckit_outbox_failed", "Outbox messages that exhausted their send retries")
ACKS = Counter("ckit_outbox_acks", "Acks applied to the outbox", ["outcome"])
BACKLOG = Gauge("ckit_outbox_backlog", "Outbox rows by state", ["state"])
LAG = Gauge("ckit_outbox_sent_to_consumed_lag_seconds",
            "Sent-to-consumed lag of the last applied ack batch (max)")
