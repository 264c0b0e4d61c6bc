"""Receipts back to the producer: durable, batched, off the hot path.

The processed row is the receipt outbox: it is committed with the handler's writes carrying
`receipt_due_at`. After the commit the pipeline hands the receipt to `ReceiptSender`, whose
thread ships batches by the configured route and then clears `receipt_due_at` (one UPDATE per
batch). Whatever did not go out (a crash, the route down) is still owed in the table: the sender
scans for it at start and every `scan_every` seconds, takes it with a guarded UPDATE and ships
it; a failed batch is owed again after a back-off. Nothing is dropped: a full memory queue only
means the scan finds those receipts instead.

Two routes: `topic` sends one receipt message per batch to `ckit-receipt-<producer>` on the
consumer's transport (applied there by `ckit receipts`); `sql` applies the batch straight to
the producer's database with the core's `ReceiptApplier`. Applying a receipt twice changes
nothing, so sending one twice (a crash between the send and the UPDATE) is harmless.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Mapping

from consumer_kit import metrics
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db_errors import describe
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.receipt import Receipt, ReceiptOutcome, encode_receipts, receipt_topic
from consumer_kit.core.receipts_applier import ReceiptApplier
from consumer_kit.core.schema import DEFAULT_OUTBOX_TABLE, DEFAULT_RECEIPT_TABLE, ProcessedStatus
from consumer_kit.core.urls import mask_url
from consumer_kit.processed import OwedReceipt, ProcessedStore
from consumer_kit.transports.base import Transport

log = logging.getLogger(__name__)

DEFAULT_BATCH = 200
#: how long the sender waits for a batch to fill
DEFAULT_LINGER = 0.05
#: how often the table is scanned for receipts still owed
DEFAULT_SCAN_EVERY = 2.0
#: a receipt owed for less than this is left to the sender that queued it in memory
DEFAULT_GRACE = dt.timedelta(seconds=10)
#: how long a scan holds the receipts it took before another scan may take them again
DEFAULT_HOLD = dt.timedelta(seconds=60)
#: back-off after a failed batch: doubles per attempt up to the cap
RETRY_BACKOFF = (1.0, 60.0)
DEFAULT_QUEUE_SIZE = 100_000


class ReceiptRoute(abc.ABC):
    """Delivers a batch of receipts to one producer."""

    name = ""

    @abc.abstractmethod
    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        """Deliver `receipts` to `producer`; raise on failure."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class TopicRoute(ReceiptRoute):
    """One receipt message per batch on the producer's receipt topic."""

    name = "topic"

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        self.transport.send(OutgoingMessage(receipt_topic(producer), encode_receipts(receipts)))


class SqlRoute(ReceiptRoute):
    """Applies receipts directly to the producer's database."""

    name = "sql"

    def __init__(self, url: str, *, outbox_table: str | None = None,
                 receipt_table: str | None = None) -> None:
        self.applier = ReceiptApplier(url, table=outbox_table or DEFAULT_OUTBOX_TABLE,
                                      receipt_table_name=receipt_table or DEFAULT_RECEIPT_TABLE,
                                      updated_by="consumer-receipts")

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        self.applier.apply(receipts)

    def close(self) -> None:
        self.applier.engine.dispose()


#: the `ByProducer` key of the route for every producer not named
ANY_PRODUCER = "*"
_UNNAMED = object()
#: a `ByProducer` warns about a producer without a route at most this often (seconds)
UNROUTED_WARN_EVERY = 60.0


class ByProducer(ReceiptRoute):
    """Each producer's receipts by its own route (`receipts={"orders": URL, ...}`): the route
    named for the producer, else the one named `"*"`; None turns a producer's receipts off (its
    rows stay SENT for its reconciler, as it asked). A producer with neither gets a warning (at
    most one a minute, with how many receipts since the last) and its receipts are left to its
    reconciler, as a database route leaves ids its outbox does not hold."""

    name = "by-producer"

    def __init__(self, routes: Mapping[str, ReceiptRoute | None]) -> None:
        self.routes = dict(routes)
        self._unrouted: dict[str, tuple[float, int]] = {}  # producer -> (warned at, since)
        # the sender's thread and a caller's flush (`ReceiptSender.flush`) deliver at once
        self._lock = threading.Lock()

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        route = self.routes.get(producer, _UNNAMED)
        if route is _UNNAMED:
            route = self.routes.get(ANY_PRODUCER, _UNNAMED)
        if isinstance(route, ReceiptRoute):
            route.deliver(producer, receipts)
            return
        if route is None:  # off for this producer, by the setting
            return
        with self._lock:
            warned, since = self._unrouted.get(producer, (-UNROUTED_WARN_EVERY, 0))
            since += len(receipts)
            now = time.monotonic()
            due = now - warned >= UNROUTED_WARN_EVERY
            self._unrouted[producer] = (now, 0) if due else (warned, since)
        if due:
            log.warning("%d receipt(s) for producer %s (message %s, ...): receipts= names no "
                        "route for it (%s) and no '*'; they are left to its reconciler",
                        since, shown(producer), receipts[0].message_id,
                        ", ".join(sorted(shown(p) for p in self.routes)))

    def close(self) -> None:
        for route in {id(r): r for r in self.routes.values() if r is not None}.values():
            route.close()


#: what `ConsumerApp(receipts=...)` takes: "topic", a database URL, a route, None, or a mapping
#: from producer name (or "*") to one of the first four
Receipts = str | ReceiptRoute | Mapping[str, str | ReceiptRoute | None] | None


def check_receipts(receipts: object) -> None:
    """Refuse a `receipts=` setting that names no route, before anything runs.

    Raises:
        ConfigError: not "topic", a URL, a `ReceiptRoute`, None, or a non-empty mapping from
            producer names to one of those.
    """
    if isinstance(receipts, Mapping):
        if not receipts:
            raise ConfigError("receipts={} names no producer: give {producer: route}, "
                              "'topic', a database URL, or None")
        for producer, spec in receipts.items():
            if not isinstance(producer, str) or not producer.strip():
                raise ConfigError(f"receipts: {producer!r} is not a producer name (or '*')")
            if spec is not None:
                _check_route(spec, f"receipts[{shown(producer)!r}]")
    elif receipts is not None:
        _check_route(receipts, "receipts")


def shown(text: str) -> str:
    """`text` (a producer name or a route of `receipts=`) fit for a message: a URL's password
    masked, and whatever comes before an `@` in text that is no URL (a URL put as a key, or
    its scheme left out)."""
    text = mask_url(text)
    if "@" in text and "***@" not in text:
        text = "***@" + text.rsplit("@", 1)[1]
    return text


def _check_route(spec: object, name: str) -> None:
    if isinstance(spec, ReceiptRoute) or spec == "topic" or (
            isinstance(spec, str) and "://" in spec):
        return
    what = shown(spec) if isinstance(spec, str) else type(spec).__name__
    raise ConfigError(f"invalid {name}={what!r}: use 'topic', the producer's database URL"
                      + (", a ReceiptRoute" if "[" in name else ", a ReceiptRoute, None, or a "
                         "mapping from producer name to one of those"))


@dataclasses.dataclass(frozen=True)
class _Owed:
    producer: str
    receipt: Receipt


def receipt_of(group: str, owed: OwedReceipt) -> Receipt:
    """The receipt a processed row owes: consumed for SUCCEEDED, rejected (with the error) for
    FAILED."""
    if owed.status is ProcessedStatus.SUCCEEDED:
        return Receipt(owed.message_id, group)
    return Receipt(owed.message_id, group, ReceiptOutcome.REJECTED, owed.error)


class ReceiptSender:
    """Ships the receipts a group owes, on a daemon thread."""

    def __init__(self, route: ReceiptRoute, store: ProcessedStore, *,
                 batch: int = DEFAULT_BATCH, linger: float = DEFAULT_LINGER,
                 scan_every: float = DEFAULT_SCAN_EVERY,
                 grace: dt.timedelta = DEFAULT_GRACE, hold: dt.timedelta = DEFAULT_HOLD,
                 queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        self.route = route
        self.store = store
        self.group = store.group
        self.batch = batch
        self.linger = linger
        self.scan_every = scan_every
        self.grace = grace
        self.hold = hold
        self._queue: queue.Queue[_Owed] = queue.Queue(queue_size)
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0  # queued or being shipped
        self._next_scan = 0.0  # scan at once: receipts owed from before a restart
        self._failures = 0
        #: receipts delivered, batches that failed (for `ckit consume` and the benchmarks)
        self.delivered = 0
        self.failed_batches = 0
        self._pending_metric = metrics.RECEIPTS_OWED.labels(self.group)
        self._thread = threading.Thread(target=self._run, name=f"ckit-receipts-{self.group}",
                                        daemon=True)
        self._thread.start()

    def put(self, producer: str, receipt: Receipt) -> None:
        """Queue a receipt whose processed row (with `receipt_due_at`) has committed. Never
        blocks: when the queue is full, the next scan finds the receipt in the table."""
        with self._idle:
            self._busy += 1
        try:
            self._queue.put_nowait(_Owed(producer, receipt))
        except queue.Full:
            self._done(1)
            log.info("message %s: receipt queue full; the next scan ships it",
                     receipt.message_id)

    def flush(self, timeout: float = 10.0, *, owed: bool = False) -> bool:
        """Wait until everything queued was shipped (or failed and is owed again); with
        `owed`, also ship what the table still owes (`ckit consume --burst` before it exits).
        True when that happened in time."""
        deadline = time.monotonic() + timeout
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout):
                return False
        while owed and time.monotonic() < deadline:
            taken = self.store.claim_owed(due_before=utcnow(), hold=self.hold, limit=self.batch)
            if not taken:
                return True
            if not self._ship([_Owed(o.producer, receipt_of(self.group, o)) for o in taken]):
                return False
        return not owed

    def close(self, timeout: float = 10.0) -> None:
        """Ship what is queued (up to `timeout`), then stop. What is left stays owed."""
        self.flush(timeout)
        self._stop.set()
        self._thread.join(timeout)
        self.route.close()

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._take()
            scanned: list[_Owed] = []
            if time.monotonic() >= self._next_scan:
                scanned = self._scan()
            if batch or scanned:
                self._ship([*batch, *scanned])
                self._done(len(batch))

    def _take(self) -> list[_Owed]:
        try:
            first = self._queue.get(timeout=min(self.scan_every, 0.5))
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + self.linger
        while len(batch) < self.batch:
            try:
                batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def _scan(self) -> list[_Owed]:
        """Receipts owed for longer than `grace` (a crash, a failed batch whose back-off is
        over, a full queue), taken so that no other sender of the group ships them too."""
        self._next_scan = time.monotonic() + self.scan_every
        try:
            taken = self.store.claim_owed(due_before=utcnow() - self.grace, hold=self.hold,
                                          limit=self.batch * 5)
            self._pending_metric.set(self.store.owed())
        except Exception as exc:  # the database is away: the next scan tries again
            if not self._stop.is_set():
                log.warning("group %s: scan for owed receipts failed: %s", self.group,
                            describe(exc))
            return []
        if taken:
            log.info("group %s: %d receipts owed from before (restart or failed delivery)",
                     self.group, len(taken))
        return [_Owed(o.producer, receipt_of(self.group, o)) for o in taken]

    def _ship(self, items: list[_Owed]) -> bool:
        by_producer: dict[str, dict[str, Receipt]] = defaultdict(dict)
        for item in items:  # one receipt per message (the last one queued wins)
            by_producer[item.producer][item.receipt.message_id] = item.receipt
        ok = True
        for producer, receipts in by_producer.items():
            ok = self._deliver(producer, list(receipts.values())) and ok
        return ok

    def _deliver(self, producer: str, receipts: list[Receipt]) -> bool:
        ids = [r.message_id for r in receipts]
        try:
            self.route.deliver(producer, receipts)
        except Exception as exc:
            self._failures += 1
            self.failed_batches += 1
            wait = min(RETRY_BACKOFF[0] * 2 ** (self._failures - 1), RETRY_BACKOFF[1])
            metrics.RECEIPT_FAILURES.labels(self.group, self.route.name).inc()
            log.warning("group %s: %d receipts for %s not delivered (first message %s), "
                        "owed again in %.0fs: %s", self.group, len(receipts), producer, ids[0],
                        wait, describe(exc))
            try:
                self.store.receipts_failed(ids, utcnow() + dt.timedelta(seconds=wait))
            except Exception as db_exc:  # still owed as they were: the scan finds them
                log.warning("group %s: could not reschedule %d receipts: %s", self.group,
                            len(ids), db_exc)
            self._next_scan = min(self._next_scan, time.monotonic() + wait)
            return False
        self._failures = 0
        self.delivered += len(receipts)
        metrics.RECEIPT_BATCHES.labels(self.group, self.route.name).inc()
        try:
            self.store.receipts_sent(ids)
        except Exception as exc:  # delivered but still marked owed: sent again later, harmless
            log.warning("group %s: %d receipts delivered but not marked sent: %s", self.group,
                        len(ids), exc)
        return True

    def _done(self, n: int) -> None:
        with self._idle:
            self._busy -= n
            self._idle.notify_all()
