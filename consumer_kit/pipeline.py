"""The per-message pipeline: dedupe id, Redis claim, handler and processed row in one
transaction, done marker, lease release, receipt, broker ack (docs/architecture.md, "The path
of one message").
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from consumer_kit import metrics
from consumer_kit.calling import call, unwrapped
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import ConsumeStatus, Delivery, Verdict
from consumer_kit.core.raised import describe_exception
from consumer_kit.core.receipt import Receipt, ReceiptOutcome
from consumer_kit.core.schema import ProcessedStatus
from consumer_kit.deadline import Watchdog
from consumer_kit.dedupe import Claim, PendingClaim, Predictor, RecentlyDone, RedisDedupe
from consumer_kit.dedupe.tokens import new_token
from consumer_kit.handling import Handling
from consumer_kit.listeners import DedupeKey, Listener, Router
from consumer_kit.message import Message
from consumer_kit.outcome import Outcome, Result, broker_ack
from consumer_kit.processed import ProcessedRowGone, ProcessedStore
from consumer_kit.receipts import ReceiptSender

log = logging.getLogger(__name__)

#: `ConsumerApp(redis_claims=...)`: a Redis claim for every message, or only while duplicates
#: are frequent (handlers with a session; see `Pipeline`)
CLAIM_MODES = ("every", "adaptive")


class Pipeline:
    """Processes deliveries for one consumer group. Thread-safe; `__call__` never raises.

    With `claims="adaptive"`, a handler that takes a session runs without a Redis claim while
    the smoothed duplicate rate (`Predictor`) is low: its processed row, inserted first in the
    handler's transaction, is the lease (a concurrent delivery of the same id waits on that
    row's lock, then finds it done) and the truth; the done marker still goes to Redis, off
    the hot path. Once duplicates grow frequent, Redis is asked first, so they never reach the
    database. Handlers without a session always take the lease."""

    def __init__(
        self,
        *,
        group: str,
        engine: Engine,
        router: Router,
        store: ProcessedStore,
        redis: RedisDedupe | None = None,
        recent: RecentlyDone | None = None,
        receipts: ReceiptSender | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        claims: str = "every",
    ) -> None:
        if claims not in CLAIM_MODES:
            raise ConfigError(f"claims must be one of {', '.join(CLAIM_MODES)}, not {claims!r}")
        self.group = group
        self.adaptive = claims == "adaptive"
        self.engine = engine
        self.router = router
        self.store = store
        self.redis = redis
        self.recent = recent or RecentlyDone()
        self.predictor = Predictor()
        self.receipts = receipts
        self.handling = Handling(engine, store, permanent=permanent)
        renew_every = redis.lease_ms / 3000 if redis is not None else 60.0
        self.watchdog = Watchdog(renew_every=renew_every, name=f"ckit-watchdog-{group}")
        #: outcomes so far (for `ckit consume` and the demo's summary)
        self.counts: collections.Counter[Outcome] = collections.Counter()
        self._counts_lock = threading.Lock()
        self._metrics: dict[tuple[Any, str], Any] = {}

    def __call__(self, delivery: Delivery) -> Verdict:
        """The transport callback: every exception is caught (one escaping a ctypes callback
        would read as CONSUME_SUCCESS in the RocketMQ client: a lost message)."""
        try:
            return broker_ack(self.process(delivery))
        except BaseException as exc:
            log.exception("message %s: pipeline error; reconsume later",
                          getattr(delivery, "broker_message_id", "?"))
            return Verdict(ConsumeStatus.RECONSUME_LATER,
                           f"pipeline error: {describe_exception(exc)}")

    def process(self, delivery: Delivery) -> Result:
        """Run the pipeline for one delivery and return its outcome."""
        msg = Message.from_delivery(delivery)
        receipt = self.receipts is not None and msg.producer is not None and msg.is_outbox
        listener = self.router.find(msg.topic, msg.tags)
        if listener is None:
            return self._finish(msg, "", receipt, self.handling.reject(
                msg, f"no listener for topic {msg.topic!r} with tags {msg.tags!r}",
                receipt=receipt))
        dedupe_key = listener.dedupe_key
        if dedupe_key is not None and not msg.is_outbox:
            # (an outbox message's ckit_id is unique, and its receipt must carry it)
            try:
                msg = msg.with_id(_listener_key(dedupe_key, msg))
            except ValueError as exc:
                return self._finish(msg, "", receipt, self.handling.reject(
                    msg, str(exc), receipt=receipt))
        elif dedupe_key is not None and (msg.resend or msg.reconsume_times > 0):
            found = self._processed_under_listener_key(dedupe_key, msg, receipt)
            if found is not None:
                return found
        if not msg.id:
            msg = msg.with_id("noid-" + hashlib.sha1(msg.topic.encode() + msg.body).hexdigest())
            return self._finish(msg, "", receipt, self.handling.reject(
                msg, "message has no id (no ckit_id, KEYS or broker id)", receipt=receipt))
        if msg.id in self.recent:
            return self._duplicate(msg, receipt, "seen by this process")
        token = new_token()
        pending: PendingClaim | None = None
        leased = self.redis is not None  # a Redis lease of ours to renew, release or finish
        expect_new = listener.wants_session and self.predictor.expect_new()
        if self.redis is None:
            claim = Claim.UNAVAILABLE
        elif expect_new and self.adaptive:
            claim = Claim.UNAVAILABLE  # the processed row's unique key decides alone
            leased = False
        elif expect_new:
            pending = self.redis.claim_later(msg.id, token)  # read after the INSERT
            claim = Claim.CLAIMED
        else:
            claim = self.redis.claim(msg.id, token)
            if claim is Claim.DUPLICATE or claim is Claim.BUSY:  # else: learnt after the run
                self.predictor.saw(claim is Claim.DUPLICATE)
        if claim is Claim.DUPLICATE:
            self.recent.add(msg.id)
            return self._duplicate(msg, receipt, "done in redis")
        if claim is Claim.BUSY:
            return self._count(msg, Result(Outcome.BUSY, "another consumer holds the lease"))
        try:
            result = self._run(listener, msg, token if leased else "", receipt, pending)
        except BaseException:  # the process stops (SystemExit, Ctrl-C: any other exception a
            # handler raises is its failure, `calling`): free the lease for the redelivery
            if leased and self.redis is not None and (
                    pending is None or pending.result() is Claim.CLAIMED):
                self.redis.release(msg.id, token)
            raise
        if pending is not None:
            answer = pending.result()  # (read already, unless the INSERT itself failed)
            self.predictor.saw(answer is Claim.DUPLICATE or result.outcome is Outcome.DUPLICATE)
            if answer is not Claim.CLAIMED:
                token = ""  # not our lease: leave it alone
            if result.outcome is Outcome.BUSY:
                return self._count(msg, result)
        elif self.redis is not None:  # no claim, or Redis did not know: the processed row says
            self.predictor.saw(result.outcome is Outcome.DUPLICATE)
        if result.outcome is Outcome.RETRY and msg.last_attempt:
            result = self.handling.dead_letter(msg, result.reason or "", receipt=receipt)
        return self._finish(msg, token, receipt, result, leased)

    def _processed_under_listener_key(self, dedupe_key: DedupeKey, msg: Message,
                                      receipt: bool) -> Result | None:
        """An outbox message processed while its listener's `dedupe_key` still applied to
        outbox messages (consumer-kit 0.1.0) has its processed row under that key, and its
        producer's row never got a receipt: the reconciler re-sends it. Such a re-send (or a
        redelivery) finds the old row here: a duplicate, recorded again under its `ckit_id`,
        which owes the producer its receipt. Asked only of re-sends and redeliveries of outbox
        messages to listeners with a `dedupe_key`; None when there is no such row."""
        try:
            key = _listener_key(dedupe_key, msg)
        except ValueError:
            return None  # (the old code rejected such a message: no row to find)
        if key == msg.id:
            return None
        try:
            if self.store.status(key) is not ProcessedStatus.SUCCEEDED:
                return None
            self.store.record(msg, ProcessedStatus.SUCCEEDED, receipt=receipt)
        except DBAPIError as exc:
            return self._count(msg, Result(
                Outcome.RETRY, f"database unavailable to look up the listener's key: {exc.orig}"))
        except ProcessedRowGone as exc:
            return self._count(msg, Result(Outcome.RETRY, str(exc)))
        log.info("message %s: processed before under its listener's dedupe_key %r; recorded "
                 "again under its ckit_id", msg.id, key)
        return self._finish(msg, "", receipt, Result(
            Outcome.DUPLICATE, "processed before under the listener's dedupe_key"))

    def _run(self, listener: Listener, msg: Message, token: str, receipt: bool,
             pending: PendingClaim | None) -> Result:
        redis = self.redis
        renew = ((lambda: redis.renew(msg.id, token)) if redis is not None and token
                 else None)
        key = self.watchdog.watch(msg.id, listener.name, listener.timeout, renew=renew,
                                  rolls_back=listener.wants_session)
        started = time.perf_counter()

        def past_deadline() -> bool:
            return time.perf_counter() - started > listener.timeout

        try:
            return self.handling.run(listener, msg, receipt=receipt, past_deadline=past_deadline,
                                     pending=pending)
        finally:
            if self.watchdog.done(key):
                self._metric(metrics.HANDLER_TIMEOUTS, msg.topic).inc()
            self._metric(metrics.HANDLER_SECONDS, msg.topic).observe(
                time.perf_counter() - started)

    def _duplicate(self, msg: Message, receipt: bool, why: str, may_run_again: bool = False
                   ) -> Result:
        """A message processed already. A re-send (`ckit_resend`) means the producer is waiting
        for a receipt: owe it again, durably, before the broker is acked."""
        if receipt and msg.resend and self.receipts is not None and msg.producer:
            try:
                status = self.store.requeue_receipt(msg.id)
            except DBAPIError as exc:
                return self._count(msg, Result(
                    Outcome.RETRY, f"database unavailable to owe the receipt again: {exc.orig}"))
            if status is not None:
                self.receipts.put(msg.producer, _receipt(self.group, msg.id, status, None))
        return self._count(msg, Result(Outcome.DUPLICATE, why, may_run_again))

    def _finish(self, msg: Message, token: str, receipt: bool, result: Result,
                leased: bool = True) -> Result:
        outcome = result.outcome
        done = outcome is Outcome.SUCCEEDED or (outcome is Outcome.DUPLICATE
                                                and not result.may_run_again)
        if self.redis is not None and token:
            if done:  # the done marker; our lease, if we hold one, goes with it
                self.redis.finish(msg.id, token)
            elif leased:  # a rejection may run again (an operator retry): never "done"
                self.redis.release(msg.id, token)
        if done:
            self.recent.add(msg.id)
        if outcome is Outcome.DUPLICATE:
            return self._duplicate(msg, receipt, result.reason or "duplicate",
                                   result.may_run_again)
        if receipt and self.receipts is not None and msg.producer:
            if outcome is Outcome.SUCCEEDED:
                self.receipts.put(msg.producer, Receipt(msg.id, self.group))
            elif outcome in (Outcome.REJECTED, Outcome.DEAD_LETTER):
                self.receipts.put(msg.producer, _receipt(
                    self.group, msg.id, ProcessedStatus.FAILED, result.reason))
        return self._count(msg, result)

    def _count(self, msg: Message, result: Result) -> Result:
        outcome = result.outcome
        with self._counts_lock:
            self.counts[outcome] += 1
        self._metric(_OUTCOME_COUNTERS[outcome], msg.topic).inc()
        if outcome is Outcome.SUCCEEDED:
            log.debug("message %s consumed", msg.id)
        elif outcome is Outcome.DUPLICATE:
            log.debug("message %s duplicate: %s", msg.id, result.reason)
        elif outcome is Outcome.BUSY:
            log.info("message %s busy: %s", msg.id, result.reason)
        elif outcome in (Outcome.REJECTED, Outcome.DEAD_LETTER):
            log.warning("message %s %s: %s", msg.id, outcome.value, result.reason)
        else:
            log.info("message %s reconsume later: %s", msg.id, result.reason)
        return result

    def close(self) -> None:
        """Stop the watchdog (the receipt sender and Redis are closed by their owner)."""
        self.watchdog.stop()

    def _metric(self, metric: Any, topic: str) -> Any:
        """`metric.labels(group, topic)`, looked up once per (metric, topic): `labels()` takes
        a lock and builds a tuple on every call."""
        child = self._metrics.get((metric, topic))
        if child is None:
            child = self._metrics[(metric, topic)] = metric.labels(self.group, topic)
        return child


def _listener_key(dedupe_key: DedupeKey, msg: Message) -> str:
    """The id a listener's `dedupe_key` gives `msg`, as text (an int is taken as its text).

    Raises:
        ValueError: the function raised (its error named; a `BaseException` too, but for one
            that stops the process, `calling`), or returned no usable id: None, "", bytes, a
            float or a bool (`str(None)` would make every such message "None": one would run,
            the others would be acked as its duplicates).
    """
    try:
        key = call(dedupe_key, msg)
    except Exception as exc:
        raise ValueError(f"dedupe_key failed: {describe_exception(unwrapped(exc))}") from exc
    if isinstance(key, bool) or not isinstance(key, str | int) or key == "":
        raise ValueError(f"dedupe_key returned {key!r}: it must return a non-empty str (or an "
                         "int)")
    return str(key)


def _receipt(group: str, message_id: str, status: ProcessedStatus, reason: str | None
             ) -> Receipt:
    if status is ProcessedStatus.SUCCEEDED:
        return Receipt(message_id, group)
    return Receipt(message_id, group, ReceiptOutcome.REJECTED, reason)


_OUTCOME_COUNTERS = {
    Outcome.SUCCEEDED: metrics.CONSUMED,
    Outcome.DUPLICATE: metrics.DUPLICATES,
    Outcome.BUSY: metrics.BUSY,
    Outcome.REJECTED: metrics.REJECTED,
    Outcome.RETRY: metrics.RETRIED,
    Outcome.DEAD_LETTER: metrics.DEAD_LETTERED,
}
