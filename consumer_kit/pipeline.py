"""The per-message pipeline (DESIGN.md, "Consumer half"): dedupe key, Redis claim, handler and
processed row in one transaction, done marker, lease release, ack, broker status."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
import time
import traceback
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from consumer_kit import metrics
from consumer_kit.ack_sender import AckSender
from consumer_kit.control import InvalidBody, Reject, Retry
from consumer_kit.dedupe import Claim, RecentlyDone, RedisDedupe
from consumer_kit.dedupe.tokens import new_token
from consumer_kit.listeners import Listener, Router
from consumer_kit.message import Message
from consumer_kit.outcome import DURABLE, Outcome, Result, broker_status
from consumer_kit.processed import ProcessedStore
from consumer_kit.schema import REASON_LEN, ProcessedStatus
from consumer_kit.transports.base import ConsumeStatus, Delivery, Verdict

log = logging.getLogger("consumer_kit.pipeline")

#: errors that can never succeed on redelivery
DEFAULT_PERMANENT: tuple[type[BaseException], ...] = (
    InvalidBody, json.JSONDecodeError, UnicodeDecodeError,
)


class Pipeline:
    """Processes deliveries for one consumer group. Thread-safe; `__call__` never raises."""

    def __init__(
        self,
        *,
        group: str,
        engine: Engine,
        router: Router,
        store: ProcessedStore,
        redis: RedisDedupe | None = None,
        recent: RecentlyDone | None = None,
        acks: AckSender | None = None,
        permanent: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.group = group
        self.engine = engine
        self.router = router
        self.store = store
        self.redis = redis
        self.recent = recent or RecentlyDone()
        self.acks = acks
        self.permanent = DEFAULT_PERMANENT + tuple(permanent)
        #: outcomes so far (for `ckit consume` and the demo's summary)
        self.counts: collections.Counter[Outcome] = collections.Counter()
        self._counts_lock = threading.Lock()
        self._metrics: dict[tuple[Any, str], Any] = {}

    def __call__(self, delivery: Delivery) -> ConsumeStatus | Verdict:
        """The transport callback: every exception is caught (one escaping a ctypes callback
        would read as CONSUME_SUCCESS in the RocketMQ client: a lost message). A retry answers
        `Verdict(RECONSUME_LATER, reason)`: the reason travels with the retry copy."""
        try:
            result = self.process(delivery)
        except BaseException:
            log.exception("message %s: pipeline error; reconsume later",
                          getattr(delivery, "broker_message_id", "?"))
            return ConsumeStatus.RECONSUME_LATER
        if result.outcome is Outcome.RETRY:
            return Verdict(ConsumeStatus.RECONSUME_LATER, result.reason or "")
        return broker_status(result.outcome)

    def process(self, delivery: Delivery) -> Result:
        """Run the pipeline for one delivery and return its outcome."""
        msg = Message.from_delivery(delivery)
        listener = self.router.find(msg.topic, msg.tags)
        if listener is None:
            return self._finish(msg, "", self._reject(
                msg, f"no listener for topic {msg.topic!r} with tags {msg.tags!r}"))
        if listener.dedupe_key is not None:
            try:
                msg = msg.with_id(str(listener.dedupe_key(msg)))
            except Exception as exc:
                return self._finish(msg, "", self._reject(
                    msg, f"dedupe_key failed: {type(exc).__name__}: {exc}"))
        if not msg.id:
            msg = msg.with_id("noid-" + hashlib.sha1(msg.topic.encode() + msg.body).hexdigest())
            return self._finish(msg, "", self._reject(
                msg, "message has no id (no ckit_id, KEYS or broker id)"))
        if msg.id in self.recent:
            return self._count(msg, Result(Outcome.DUPLICATE, "seen by this process"))
        token = new_token()
        claim = self.redis.claim(msg.id, token) if self.redis else Claim.UNAVAILABLE
        if claim is Claim.DUPLICATE:
            self.recent.add(msg.id)
            return self._count(msg, Result(Outcome.DUPLICATE, "done in redis"))
        if claim is Claim.BUSY:
            return self._count(msg, Result(Outcome.BUSY, "another consumer holds the lease"))
        try:
            result = self._run(listener, msg)
        except BaseException:  # SystemExit from a handler: free the lease for the redelivery
            if self.redis is not None:
                self.redis.release(msg.id, token)
            raise
        return self._finish(msg, token, result)

    def _run(self, listener: Listener, msg: Message) -> Result:
        started = time.perf_counter()
        try:
            if listener.wants_session:
                return self._run_in_transaction(listener, msg)
            return self._run_then_record(listener, msg)
        finally:
            self._metric(metrics.HANDLER_SECONDS, msg.topic).observe(
                time.perf_counter() - started)

    def _run_in_transaction(self, listener: Listener, msg: Message) -> Result:
        try:
            with self.engine.connect() as conn:
                tx = conn.begin()
                try:
                    if not self.store.insert(conn, msg, ProcessedStatus.SUCCEEDED):
                        tx.rollback()
                        return Result(Outcome.DUPLICATE, "processed row exists")
                    with Session(bind=conn) as session:
                        listener.fn(msg, session)
                        session.flush()
                    tx.commit()
                except BaseException:
                    if tx.is_active:
                        tx.rollback()
                    raise
        except Exception as exc:
            return self._failure(listener, msg, exc)
        return Result(Outcome.SUCCEEDED)

    def _run_then_record(self, listener: Listener, msg: Message) -> Result:
        try:
            if self.store.status(msg.id) is not None:
                return Result(Outcome.DUPLICATE, "processed row exists")
            listener.fn(msg)
        except Exception as exc:
            return self._failure(listener, msg, exc)
        try:
            if not self.store.record(msg, ProcessedStatus.SUCCEEDED):
                log.warning("message %s: processed concurrently by another consumer "
                            "(a handler without a session is at-least-once)", msg.id)
        except DBAPIError as exc:
            return Result(Outcome.RETRY, f"database unavailable after the handler: {exc.orig}")
        return Result(Outcome.SUCCEEDED)

    def _failure(self, listener: Listener, msg: Message, exc: Exception) -> Result:
        if isinstance(exc, Reject):
            return self._reject(msg, exc.reason)
        if isinstance(exc, self.permanent + listener.permanent):
            return self._reject(msg, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, Retry):
            wish = f" (asked for a delay of {exc.delay})" if exc.delay is not None else ""
            return Result(Outcome.RETRY, exc.reason + wish)
        if isinstance(exc, DBAPIError):
            return Result(Outcome.RETRY, f"database error: {exc.orig or exc}")
        log.warning("message %s: handler %s raised, reconsume later:\n%s", msg.id, listener.name,
                    "".join(traceback.format_exception(exc)).rstrip())
        return Result(Outcome.RETRY, f"{type(exc).__name__}: {exc}")

    def _reject(self, msg: Message, reason: str) -> Result:
        """Record FAILED with the reason (durably) before the broker is acked."""
        try:
            if not self.store.record(msg, ProcessedStatus.FAILED, reason[:REASON_LEN]):
                return Result(Outcome.DUPLICATE, "processed row exists")
        except DBAPIError as exc:
            return Result(Outcome.RETRY, f"database unavailable to record a reject: {exc.orig}")
        return Result(Outcome.REJECTED, reason)

    def _finish(self, msg: Message, token: str, result: Result) -> Result:
        durable = result.outcome in DURABLE
        if self.redis is not None and token:
            if durable:
                self.redis.finish(msg.id, token)
            else:
                self.redis.release(msg.id, token)
        if durable:
            self.recent.add(msg.id)
        if self.acks is not None and msg.producer and msg.is_outbox:
            if result.outcome is Outcome.SUCCEEDED:
                self.acks.put(msg.producer, msg.id, "consumed")
            elif result.outcome is Outcome.REJECTED:
                self.acks.put(msg.producer, msg.id, "rejected", result.reason)
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
        elif outcome is Outcome.REJECTED:
            log.warning("message %s rejected: %s", msg.id, result.reason)
        else:
            log.info("message %s reconsume later: %s", msg.id, result.reason)
        return result

    def _metric(self, metric: Any, topic: str) -> Any:
        """`metric.labels(group, topic)`, looked up once per (metric, topic): `labels()` takes
        a lock and builds a tuple on every call."""
        child = self._metrics.get((metric, topic))
        if child is None:
            child = self._metrics[(metric, topic)] = metric.labels(self.group, topic)
        return child


_OUTCOME_COUNTERS = {
    Outcome.SUCCEEDED: metrics.CONSUMED,
    Outcome.DUPLICATE: metrics.DUPLICATES,
    Outcome.BUSY: metrics.BUSY,
    Outcome.REJECTED: metrics.REJECTED,
    Outcome.RETRY: metrics.RETRIED,
}
