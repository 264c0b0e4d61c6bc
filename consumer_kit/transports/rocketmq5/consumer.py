"""The consumer of the `rocketmq5://` transport: worker threads around one SimpleConsumer.

Why the SimpleConsumer and not the client's PushConsumer: every decision about a message is made
here, after the callback has answered, so none is lost to an exception: CONSUME_SUCCESS acks it;
RECONSUME_LATER (or an exception) changes its invisible duration to the back-off of its attempt,
so the broker redelivers it then and counts the attempt (a busy answer, `Verdict.spend` False,
is asked again by the same worker after the back-off instead, so it spends no attempt); at the
group's last attempt the message
is copied to `%DLQ%group` with the reason and acked (the broker's own dead-lettering, which the
proxy does on the next receive, keeps no reason); should that copy fail, the broker's path is
taken. A message that is never answered (the process dies) comes back when its invisible time
runs out. Shutdown stops receiving, lets running callbacks finish and is bounded.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from consumer_kit.core.envelope import PROP_ID, PROP_REASON, split_keys
from consumer_kit.core.errors import TransportError
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    Subscription,
    Verdict,
    as_verdict,
    dlq_topic,
)
from consumer_kit.transports.base import Consumer, all_ordered, clip_reason, retry_delay
from consumer_kit.transports.rocketmq5 import client
from consumer_kit.transports.rocketmq5.route import Route
from consumer_kit.transports.rocketmq5.settings import fifo_only, settings_problem, simple_consumer
from consumer_kit.transports.rocketmq5.wire import (
    PROP_DLQ_TOPIC,
    received_delivery,
    route_hint,
)

log = logging.getLogger("consumer_kit.transports.rocketmq5")

DEFAULT_SHUTDOWN_TIMEOUT = 10.0
DEFAULT_SETTINGS_TIMEOUT = 10.0
#: RECONSUME_LATER reasons kept for redeliveries to this process (the broker cannot carry them)
MAX_KEPT_REASONS = 10_000
_ERROR_PAUSE = 1.0
#: Least seconds between two re-sends of the consumer's settings after failed receives
_RESYNC_EVERY = 5.0
_local = threading.local()

AnswerCallback = Callable[[Delivery], "ConsumeStatus | Verdict"]


class Host(Protocol):
    """What a consumer needs of its transport (`RocketMQ5Transport`)."""

    endpoint: str
    namesrv: str | None
    ordered_topics: frozenset[str]
    max_reconsume_times: int | None
    retry_delays: tuple[float, ...]
    invisible_seconds: float
    await_seconds: float

    @property
    def configuration(self) -> Any: ...

    def prepare_group(self, group: str, *, fifo: bool = False) -> None: ...

    def route(self, topic: str) -> Route: ...

    def failure(self, exc: BaseException, what: str, *, topic: str) -> TransportError: ...

    def send_raw(self, topic: str, body: bytes, *, tags: str | None, keys: Sequence[str],
                 properties: Mapping[str, str]) -> Any: ...


class _Reasons:
    """The last RECONSUME_LATER reason per broker message id, bounded (oldest dropped)."""

    def __init__(self, limit: int = MAX_KEPT_REASONS) -> None:
        self._items: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def get(self, message_id: str) -> str:
        with self._lock:
            return self._items.get(message_id, "")

    def put(self, message_id: str, reason: str) -> None:
        with self._lock:
            self._items[message_id] = reason
            self._items.move_to_end(message_id)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def drop(self, message_id: str) -> None:
        with self._lock:
            self._items.pop(message_id, None)


class RocketMQ5Consumer(Consumer):
    """`threads` workers, each receiving one message at a time from one SimpleConsumer."""

    def __init__(self, transport: Host, group: str,
                 subscriptions: Sequence[Subscription], callback: AnswerCallback, *,
                 threads: int) -> None:
        self.transport = transport
        self.group = group
        self.subscriptions = list(subscriptions)
        self.callback = callback
        self.threads = threads
        self.fifo = all_ordered(group, self.subscriptions, transport.ordered_topics)
        self._simple: Any = None
        self._workers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._reasons = _Reasons()
        self._next_resync = 0.0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def max_reconsume_times(self) -> int | None:
        attempts = getattr(self._simple, "ckit_max_attempts", None)
        return None if attempts is None else attempts - 1

    # -------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Prepare the group (when the name server is known), subscribe every topic, start the
        workers.

        Raises:
            TransportUnavailable: the proxy cannot be reached.
            TransportError: a topic does not exist, a FIFO group on a topic that is not FIFO, a
                group that is not FIFO for ordered topics or a FIFO topic, or a group whose
                retry limit on the proxy is not `max_reconsume_times`.
            ConfigError: the endpoint is not a gRPC proxy, or the client is not installed.
        """
        if self._simple is not None:
            return
        transport = self.transport
        lib = client.v5()
        routes = {s.topic: transport.route(s.topic) for s in self.subscriptions}
        # a FIFO topic's group is written FIFO even when the topic is not in ordered_topics
        # (an operator's FIFO group is never turned back into a normal one)
        transport.prepare_group(self.group, fifo=self.fifo or bool(fifo_only(routes)))
        simple = simple_consumer(transport.configuration, self.group,
                                 await_duration=max(1, round(transport.await_seconds)))
        try:
            simple.startup()
            for sub in self.subscriptions:
                simple.subscribe(sub.topic, lib.FilterExpression(sub.expression or "*"))
            self._wait_for_settings(simple)
        except TransportError:
            _quietly(simple.shutdown)
            raise
        except Exception as exc:
            _quietly(simple.shutdown)
            raise transport.failure(exc, f"starting consumer {self.group}",
                                    topic=self.subscriptions[0].topic) from exc
        problem = settings_problem(self.group, routes, ordered=self.fifo,
                                   fifo_group=bool(simple.ckit_fifo),
                                   max_attempts=simple.ckit_max_attempts,
                                   max_reconsume_times=transport.max_reconsume_times,
                                   namesrv=transport.namesrv, endpoint=transport.endpoint)
        if problem:
            _quietly(simple.shutdown)
            raise TransportError(problem)
        self._simple = simple
        self._stop.clear()
        self._workers = [threading.Thread(target=self._work, name=f"ckit-rmq5-{self.group}-{i}",
                                          daemon=True) for i in range(self.threads)]
        for worker in self._workers:
            worker.start()
        log.info("consumer %s started on %s (%d threads%s): %s", self.group, transport.endpoint,
                 self.threads, ", FIFO" if simple.ckit_fifo else "",
                 ", ".join(f"{s.topic}[{s.expression}]" for s in self.subscriptions))

    def _wait_for_settings(self, simple: Any) -> None:
        # The proxy answers receives with an error until it has the client's settings.
        event = getattr(simple, "_init_settings_event", None)
        if event is not None and not event.wait(DEFAULT_SETTINGS_TIMEOUT):
            raise TransportError(f"consumer {self.group}: no settings from the proxy in "
                                 f"{DEFAULT_SETTINGS_TIMEOUT:g} s")

    def shutdown(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
        """Stop receiving, let running callbacks finish, then close the client; waits up to
        `timeout` seconds (a receive in progress returns within the long poll, ~5 s).

        Raises:
            TransportError: called from a consume callback (it would wait for itself).
        """
        if getattr(_local, "consumer", None) is self:
            raise TransportError(f"consumer {self.group}: shutdown() called from its callback")
        simple = self._simple
        if simple is None or self._stop.is_set():
            return
        began = time.monotonic()
        self._stop.set()
        deadline = began + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        alive = [w.name for w in self._workers if w.is_alive()]
        if alive:
            log.warning("consumer %s: %d workers still busy after %.1f s (%d in flight); "
                        "closing the client anyway", self.group, len(alive), timeout,
                        self._in_flight)
        _quietly(simple.shutdown)
        self._simple = None
        log.info("consumer %s shut down in %.2f s", self.group, time.monotonic() - began)

    # ---------------------------------------------------------------------------------- workers

    def _work(self) -> None:
        simple = self._simple
        invisible = max(1, math.ceil(self.transport.invisible_seconds))
        while not self._stop.is_set() and simple is not None:
            try:
                messages = simple.receive(1, invisible)
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("consumer %s: receive failed (%s); again in %.0f s", self.group,
                            route_hint(exc), _ERROR_PAUSE)
                self._resync(simple)
                self._stop.wait(_ERROR_PAUSE)
                continue
            for message in messages or ():
                # Received before the stop: handle it (its callback is still valid), so it
                # does not wait out its invisible time.
                self._handle(simple, message)

    def _resync(self, simple: Any) -> None:
        """Send the consumer's settings to the proxy again (at most every `_RESYNC_EVERY`).

        A restarted proxy has forgotten them and answers every receive with an error ("settings
        is null"), and the 5.1.2 client sends them on its own only every 300 s: its consumers
        received nothing for 120-154 s in the fault runs after a proxy kill -9. Re-sending them
        is harmless when they were not lost. A write on the dead telemetry stream fails and the
        client rebuilds the stream; the next re-send goes through it."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_resync:
                return
            self._next_resync = now + _RESYNC_EVERY
        try:
            endpoints = list(simple.route_manager.get_all_endpoints().values())
            for each in endpoints:
                simple.on_new_endpoints(each)
        except Exception as exc:  # the next failed receive tries again
            log.warning("consumer %s: could not send its settings again: %s", self.group, exc)
            return
        log.info("consumer %s: settings sent again to %d endpoint(s) after a failed receive",
                 self.group, len(endpoints))

    def _handle(self, simple: Any, message: Any) -> None:
        message_id = str(getattr(message, "message_id", "?"))
        with self._lock:
            self._in_flight += 1
        _local.consumer = self
        try:
            try:
                delivery = received_delivery(message, reason=self._reasons.get(message_id),
                                             max_reconsume_times=self.max_reconsume_times)
            except ValueError as exc:  # a body it cannot decode: no delivery can ever succeed
                self._undecodable(simple, message, message_id, exc)
                return
            ckit_id = delivery.properties.get(PROP_ID) or message_id
            verdict = self._answer(delivery, ckit_id)
            while not verdict.spend and verdict.status is ConsumeStatus.RECONSUME_LATER:
                if not self._hold(simple, message, delivery, ckit_id):
                    return  # stopping: it comes back after its invisible time
                verdict = self._answer(delivery, ckit_id)
            reason = clip_reason(verdict.reason)
            if verdict.status is ConsumeStatus.CONSUME_SUCCESS:
                self._reasons.drop(message_id)
                self._ack(simple, message, ckit_id)
            else:
                self._later(simple, message, delivery, reason, ckit_id)
        except BaseException:  # the last line: the message comes back after its invisible time
            log.exception("consumer %s: message %s: not answered; it comes back after its "
                          "invisible time", self.group, message_id)
        finally:
            _local.consumer = None
            with self._lock:
                self._in_flight -= 1

    def _undecodable(self, simple: Any, message: Any, message_id: str, error: Exception
                     ) -> None:
        """A message no handler can be given (a body marked base64 that is not): to the dead
        letters at once, as it travelled, with why (retried, it would come back every
        invisible time until the broker dead-letters it without a reason)."""
        raw = received_delivery(message, reason="", max_reconsume_times=self.max_reconsume_times,
                                decode=False)
        ckit_id = raw.properties.get(PROP_ID) or message_id
        log.error("consumer %s: message %s: undecodable body (%s): to %s", self.group, ckit_id,
                  error, dlq_topic(self.group))
        if not self._dead_letter(simple, message, raw, f"undecodable body: {error}", ckit_id):
            log.error("consumer %s: message %s: left to come back after its invisible time",
                      self.group, ckit_id)

    def _answer(self, delivery: Delivery, ckit_id: str) -> Verdict:
        try:
            return as_verdict(self.callback(delivery))
        except BaseException as exc:  # an exception means "later", never an ack
            log.exception("consumer %s: message %s: callback failed; reconsume later",
                          self.group, ckit_id)
            return Verdict(ConsumeStatus.RECONSUME_LATER, f"{type(exc).__name__}: {exc}")

    def _hold(self, simple: Any, message: Any, delivery: Delivery, ckit_id: str) -> bool:
        """A busy answer (`Verdict.spend` False): the broker counts every receive as an
        attempt, so instead of handing the message back this worker keeps it hidden for the
        back-off and asks the callback again. False when the consumer is stopping or the message
        could not be kept hidden (it then comes back after its invisible time)."""
        delay = retry_delay(self.transport.retry_delays, delivery.reconsume_times)
        keep = max(1, math.ceil(delay + self.transport.invisible_seconds))
        try:
            simple.change_invisible_duration(message, keep)
        except Exception as exc:
            log.warning("consumer %s: message %s: busy, and could not keep it hidden (%s); it "
                        "comes back after its invisible time", self.group, ckit_id, exc)
            return False
        log.debug("consumer %s: message %s busy: asked again in %.0f s", self.group, ckit_id,
                  delay)
        return not self._stop.wait(delay)

    def _ack(self, simple: Any, message: Any, ckit_id: str) -> None:
        try:
            simple.ack(message)
        except Exception as exc:  # redelivered after its invisible time; dedupe absorbs it
            log.warning("consumer %s: message %s: ack failed (%s); it will be redelivered",
                        self.group, ckit_id, exc)

    def _later(self, simple: Any, message: Any, delivery: Delivery, reason: str,
               ckit_id: str) -> None:
        last = self.max_reconsume_times
        if last is not None and delivery.reconsume_times >= last and \
                self._dead_letter(simple, message, delivery, reason, ckit_id):
            return
        if reason:
            self._reasons.put(delivery.broker_message_id, reason)
        delay = retry_delay(self.transport.retry_delays, delivery.reconsume_times)
        try:
            simple.change_invisible_duration(message, max(1, math.ceil(delay)))
            log.debug("consumer %s: message %s: reconsume in %.0f s (%s)", self.group, ckit_id,
                      delay, reason or "no reason")
        except Exception as exc:  # it comes back when the receive's invisible time runs out
            log.warning("consumer %s: message %s: could not schedule the redelivery (%s); it "
                        "comes back after its invisible time", self.group, ckit_id, exc)

    def _dead_letter(self, simple: Any, message: Any, delivery: Delivery, reason: str,
                     ckit_id: str) -> bool:
        """Copy the message with its reason to `%DLQ%group`, then ack it. False when the copy
        failed (the broker's own dead-lettering then takes it, without the reason)."""
        properties = dict(delivery.properties)
        properties[PROP_DLQ_TOPIC] = delivery.topic
        if reason:
            properties[PROP_REASON] = reason
        try:
            self.transport.send_raw(dlq_topic(self.group), delivery.body, tags=delivery.tags,
                                    keys=split_keys(delivery.keys), properties=properties)
        except Exception as exc:
            log.warning("consumer %s: message %s: copy to %s failed (%s); leaving it to the "
                        "broker's dead-lettering", self.group, ckit_id, dlq_topic(self.group),
                        exc)
            return False
        self._reasons.drop(delivery.broker_message_id)
        self._ack(simple, message, ckit_id)
        log.warning("consumer %s: message %s: retries exhausted after %d deliveries; moved to "
                    "%s: %s", self.group, ckit_id, delivery.reconsume_times + 1,
                    dlq_topic(self.group), reason or "no reason given")
        return True


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:
        log.debug("ignored during cleanup", exc_info=True)
