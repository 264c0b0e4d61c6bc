"""Prometheus metrics of the consumer half (registered once, in the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONSUMED = Counter("ckit_consumed", "Messages whose handler succeeded", ["group", "topic"])
DUPLICATES = Counter("ckit_duplicates", "Deliveries skipped as duplicates", ["group", "topic"])
BUSY = Counter("ckit_busy", "Deliveries deferred: another consumer holds the lease",
               ["group", "topic"])
REJECTED = Counter("ckit_rejected", "Messages refused permanently", ["group", "topic"])
RETRIED = Counter("ckit_retried", "Deliveries answered RECONSUME_LATER", ["group", "topic"])
HANDLER_SECONDS = Histogram("ckit_handler_seconds", "Handler time (incl. its transaction)",
                            ["group", "topic"])
ACK_BATCHES = Counter("ckit_ack_batches", "Ack batches sent to producers", ["group", "route"])
ACKS_LOST = Counter("ckit_acks_lost", "Acks given up after retries (the reconciler repairs)",
                    ["group"])
DEGRADED = Gauge("ckit_redis_degraded", "1 while Redis is down and the database path decides",
                 ["group"])
