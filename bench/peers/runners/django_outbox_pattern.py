"""django-outbox-pattern: `Published.objects.create(...)` in the caller's transaction, its
`Producer.publish_message_from_database()` relay, and its idempotent `Consumer`, all with a
no-op STOMP connection in place of the broker. Runs in its own environment."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from typing import Any

from bench.peers import harness
from bench.peers.runners import django_setup

DESTINATION = "/exchange/orders/created"


class NullStomp:
    """What the package calls on a stomp.py connection, doing nothing (counts sends)."""

    def __init__(self) -> None:
        self.sent = 0
        self.acks = 0
        self.listeners: dict[str, Any] = {}

    def is_connected(self) -> bool:
        return True

    def connect(self, **_: Any) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def send(self, **_: Any) -> None:
        self.sent += 1

    def ack(self, *_: Any, **__: Any) -> None:
        self.acks += 1

    def nack(self, *_: Any, **__: Any) -> None:
        raise SystemExit("a message was nacked: the bench handler failed")

    def set_listener(self, name: str, listener: Any) -> None:
        self.listeners[name] = listener

    def get_listener(self, name: str) -> Any:
        return self.listeners.get(name)

    def remove_listener(self, name: str) -> None:
        self.listeners.pop(name, None)

    def subscribe(self, *_: Any, **__: Any) -> None:
        pass

    def unsubscribe(self, *_: Any, **__: Any) -> None:
        pass


def payload(key: str) -> dict[str, Any]:
    return {"order_id": key, "sku": "SKU-1", "qty": 1}


def publish(job: dict[str, Any]) -> dict[str, Any]:
    from django.db import connection, transaction
    from django.utils import timezone
    from django_outbox_pattern.models import Published

    from bench.peers.runners.djapp.models import Order

    quote = connection.ops.quote_name
    table = Published._meta.db_table
    floor_sql = (f"INSERT INTO {quote(table)} (id, version, destination, body, added, "
                 "expires_at, retry, status, headers) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)")
    uuid_value = (lambda u: u.hex) if connection.vendor == "mysql" else (lambda u: u)

    def bare(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(sku=key, qty=1)

    def floor(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(sku=key, qty=1)
            now = timezone.now()
            msg_id = uuid.uuid4()
            headers = {"dop-msg-id": str(msg_id), "dop-msg-destination": DESTINATION,
                       "dop-msg-type": "Published", "dop-msg-sent-time": now.isoformat(),
                       "dop-correlation-id": str(uuid.uuid4())}
            with connection.cursor() as cursor:
                cursor.execute(floor_sql, [uuid_value(msg_id), None, DESTINATION,
                                           json.dumps(payload(key)), now,
                                           now + dt.timedelta(days=1), 0, 1,
                                           json.dumps(headers)])

    def with_publish(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(sku=key, qty=1)
            Published.objects.create(destination=DESTINATION, body=payload(key))

    runs = harness.publish_runs([("bare", bare), ("floor", floor), ("publish", with_publish)],
                                int(job["n"]), int(job["runs"]))
    return {"runs": runs}


def drain(job: dict[str, Any]) -> dict[str, Any]:
    from django_outbox_pattern import settings as dop_settings
    from django_outbox_pattern.choices import StatusChoice
    from django_outbox_pattern.headers import get_message_headers
    from django_outbox_pattern.models import Published
    from django_outbox_pattern.producers import Producer

    def fill(n: int) -> None:
        django_setup.truncate(Published)
        rows = []
        for i in range(n):
            row = Published(destination=DESTINATION, body=payload(str(i)))
            row.headers = get_message_headers(row)  # what save() would have added
            rows.append(row)
        Published.objects.bulk_create(rows, batch_size=2000)
        django_setup.analyze(Published)

    def run(setting: dict[str, Any], n: int) -> tuple[float, int]:
        dop_settings.DEFAULT_PUBLISHED_CHUNK_SIZE = int(setting["chunk"])
        stomp = NullStomp()
        producer = Producer(stomp, "guest", "guest")
        t0 = time.perf_counter()
        producer.publish_message_from_database()
        seconds = time.perf_counter() - t0
        done = Published.objects.filter(status=StatusChoice.SUCCEEDED).count()
        if done != stomp.sent:
            raise SystemExit(f"{stomp.sent} sent but {done} rows SUCCEEDED")
        return seconds, stomp.sent

    return harness.drain_runs(job, fill, run)


def dedupe(job: dict[str, Any]) -> dict[str, Any]:
    from django.db import transaction
    from django_outbox_pattern.consumers import Consumer
    from django_outbox_pattern.models import Received

    from bench.peers.runners.djapp.models import Effect

    def handle(body: dict[str, Any]) -> None:
        Effect.objects.create(sku=body["sku"], qty=body["qty"])

    def callback(payload: Any) -> None:  # the shape its README prescribes
        with transaction.atomic():
            handle(payload.body)
            payload.save()

    stomp = NullStomp()
    consumer = Consumer(stomp, "guest", "guest")
    consumer.callback = callback

    def message(key: str) -> tuple[str, dict[str, str]]:
        return (json.dumps({"sku": key, "qty": 1}),
                {"message-id": "B" + key, "dop-msg-id": key, "destination": DESTINATION})

    def bare(key: str) -> None:
        body, _ = message(key)
        with transaction.atomic():
            handle(json.loads(body))

    def decorated(key: str) -> None:
        consumer.message_handler(*message(key))

    runs = harness.dedupe_runs([("bare", bare), ("decorated", decorated)],
                               int(job["n"]), int(job["runs"]))
    keys = [f"r{run}-{i}" for run in range(int(job["runs"])) for i in range(int(job["n"]))]
    dup_keys = keys[: int(job["duplicates"])]
    before = Received.objects.count()
    acks = stomp.acks
    rates, passes = harness.duplicate_rates([("decorated", decorated)], dup_keys,
                                            int(job["runs"]))
    if Received.objects.count() != before \
            or stomp.acks - acks != harness.duplicates_sent(dup_keys, int(job["runs"])):
        raise SystemExit("duplicates were not all acked without a new received row")
    made = Effect.objects.count()
    return {"runs": runs, "duplicates": rates, "duplicates_runs": passes,
            "duplicates_n": len(dup_keys),
            "effects": made, "effects_expected": 2 * (len(keys) + 50)}


def main() -> None:
    job = harness.read_job()
    django_setup.configure(job, "django_outbox_pattern", DJANGO_OUTBOX_PATTERN={
        "DEFAULT_PRODUCER_WAITING_TIME": 0})  # its relay sleeps 1 s after every pass otherwise
    from django_outbox_pattern.models import Published, Received

    from bench.peers.runners.djapp.models import Effect, Order

    prefix = job["prefix"]
    django_setup.rename(Published, f"{prefix}_published")
    django_setup.rename(Received, f"{prefix}_received")
    models = (Order, Effect, Published, Received)
    django_setup.create(*models)
    try:
        measure = {"publish": publish, "drain": drain, "dedupe": dedupe}[job["measure"]]
        result = measure(job)
    finally:
        django_setup.drop(*models)
    result["versions"] = harness.versions("django-outbox-pattern", "Django", "PyMySQL",
                                          "psycopg")
    harness.emit(result)


if __name__ == "__main__":
    main()
