"""django-jaiminho: a `@save_to_outbox` function called in the caller's transaction (keep-order:
the event row is written there; publish-on-commit, its default: the call runs from on_commit),
and its `EventRelayer` calling the stored functions (a no-op). Runs in its own environment."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from bench.peers import harness
from bench.peers.runners import django_setup


def payload(key: str) -> dict[str, Any]:
    return {"order_id": key, "sku": "SKU-1", "qty": 1}


def publish(job: dict[str, Any]) -> dict[str, Any]:
    import dill
    from django.db import connection, transaction
    from django.utils import timezone
    from jaiminho.models import Event

    from bench.peers.runners.djapp import tasks
    from bench.peers.runners.djapp.models import Order

    quote = connection.ops.quote_name
    floor_sql = (f"INSERT INTO {quote(Event._meta.db_table)} (message, function, kwargs, "
                 "signature, created_at, sent_at, stream, strategy) "
                 "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
    function_dump = dill.dumps(tasks.send_order)

    def bare(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(sku=key, qty=1)

    def floor(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(sku=key, qty=1)
            with connection.cursor() as cursor:
                cursor.execute(floor_sql, [dill.dumps((payload(key),)), function_dump, None,
                                           "x" * 27, timezone.now(), None, None, job["strategy"]])

    def with_publish(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(sku=key, qty=1)
            tasks.send_order(payload(key))

    variants = [("bare", bare), ("publish", with_publish)]
    if job["strategy"] == "keep-order":  # publish-on-commit writes no row: it has no floor
        variants.insert(1, ("floor", floor))
    runs = harness.publish_runs(variants, int(job["n"]), int(job["runs"]))
    rows = Event.objects.count()
    return {"runs": runs, "event_rows": rows, "sent_on_commit": tasks.SENT[0]}


def drain(job: dict[str, Any]) -> dict[str, Any]:
    from jaiminho import settings as jaiminho_settings
    from jaiminho.constants import PublishStrategyType
    from jaiminho.models import Event
    from jaiminho.publish_strategies import create_event_data
    from jaiminho.relayer import EventRelayer

    from bench.peers.runners.djapp import tasks

    def fill(n: int) -> None:
        django_setup.truncate(Event)
        rows = []
        for i in range(n):
            event = Event(**create_event_data(tasks.send_order, (payload(str(i)),), {},
                                              PublishStrategyType.KEEP_ORDER))
            event.signature = event._generate_event_signature()  # what save() would do
            rows.append(event)
        Event.objects.bulk_create(rows, batch_size=2000)
        django_setup.analyze(Event)

    def run(setting: dict[str, Any], n: int) -> tuple[float, int]:
        jaiminho_settings.delete_after_send = bool(setting["delete"])
        before = tasks.SENT[0]
        t0 = time.perf_counter()
        EventRelayer().relay()
        seconds = time.perf_counter() - t0
        sent = tasks.SENT[0] - before
        if Event.objects.filter(sent_at__isnull=True).count():
            raise SystemExit("rows left unsent after the relay pass")
        return seconds, sent

    return harness.drain_runs(job, fill, run)


def main() -> None:
    job = harness.read_job()
    strategy = job.get("strategy", "keep-order")
    django_setup.configure(job, "jaiminho", JAIMINHO_CONFIG={
        "PUBLISH_STRATEGY": strategy, "PERSIST_ALL_EVENTS": False,
        "DELETE_AFTER_SEND": False, "TIME_TO_DELETE": dt.timedelta(days=7)})
    from jaiminho.models import Event

    from bench.peers.runners.djapp.models import Order

    django_setup.rename(Event, f"{job['prefix']}_event")
    models = (Order, Event)
    django_setup.create(*models)
    try:
        result = publish(job) if job["measure"] == "publish" else drain(job)
    finally:
        django_setup.drop(*models)
    result["versions"] = harness.versions("django-jaiminho", "Django", "dill", "PyMySQL",
                                          "psycopg")
    harness.emit(result)


if __name__ == "__main__":
    main()
