"""Prometheus metrics of the consumer half (registered once, in the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONSUMED = Counter("ckit_consumed", "Messages whose handler succeeded", ["group", "topic"])
DUPLICATES = Counter("ckit_duplicates", "Deliveries skipped as duplicates", ["group", "topic"])
BUSY = Counter("ckit_busy", "Deliveries deferred: another consumer holds the handler lease",
               ["group", "topic"])
REJECTED = Counter("ckit_rejected", "Messages refused permanently", ["group", "topic"])
RETRIED = Counter("ckit_retried",
                  "Deliveries answered RECONSUME_LATER after a transient failure (busy ones "
                  "count in ckit_busy)", ["group", "topic"])
DEAD_LETTERED = Counter("ckit_dead_lettered",
                        "Messages whose retries are spent (recorded DEAD_LETTERED, to the "
                        "DLQ)",
                        ["group", "topic"])
HANDLER_SECONDS = Histogram("ckit_handler_seconds", "Handler time (incl. its transaction)",
                            ["group", "topic"])
HANDLER_TIMEOUTS = Counter("ckit_handler_timeouts",
                           "Handlers past their timeout (rolled back, redelivered)",
                           ["group", "topic"])
RECEIPT_BATCHES = Counter("ckit_receipt_batches", "Receipt batches delivered to producers",
                          ["group", "route"])
RECEIPT_FAILURES = Counter("ckit_receipt_failures",
                           "Receipt batches that failed (owed again after a back-off)",
                           ["group", "route"])
RECEIPTS_OWED = Gauge("ckit_receipts_owed",
                      "Receipts the processed table still owes to producers", ["group"])
DEGRADED = Gauge("ckit_redis_degraded", "1 while Redis is down and the database path decides",
                 ["group"])
