"""The RocketMQ push consumer of the transport: one PushConsumer per `consumer(...)` call, one
routing callback for all its topics, never raising into the C++ client.

A concurrent consumer never answers RECONSUME_LATER to the native client (which would send the
whole pulled batch back, see `sendback`): a message whose callback failed is sent back
by the transport itself, with the callback's reason, and answered CONSUME_SUCCESS. Only when
that send-back fails is RECONSUME_LATER the last resort. An orderly consumer answers
RECONSUME_LATER as before: the native client then suspends the queue and redelivers the batch
in order (later messages of an ordered queue wait for the failed one by design).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from consumer_kit.core.envelope import PROP_ID
from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    DeliveryCallback,
    Subscription,
    Verdict,
    as_verdict,
    retry_topic,
)
from consumer_kit.transports.base import Consumer, all_ordered
from consumer_kit.transports.rocketmq import native
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from consumer_kit.transports.rocketmq.liveness import STALLS, owned_backlog
from consumer_kit.transports.rocketmq.resolve import for_native
from consumer_kit.transports.rocketmq.sendback import SendBack
from consumer_kit.transports.rocketmq.wire import received_delivery, translate


class ConsumerHost(Protocol):
    """What a consumer uses of its transport (`RocketMQTransport` is one)."""

    addr: str
    ordered_topics: frozenset[str]
    extra_properties: tuple[str, ...]
    create_topics: bool
    client_log_dir: str | None
    client_log_level: str | None
    admin: RocketMQAdmin
    send_back_patience: float
    stall_after: float
    max_rebuilds: int

    def ensure_topic(self, topic: str) -> None: ...

    def missing_topics(self, topics: list[str]) -> list[str]: ...

    def prepare_group(self, group: str) -> None: ...

log = logging.getLogger(__name__)

DEFAULT_SHUTDOWN_TIMEOUT = 10.0
#: Running consumers and their ctypes callbacks, kept alive until shutdown has returned.
_LIVE: set[RocketMQConsumer] = set()
_LIVE_LOCK = threading.Lock()
_local = threading.local()


class RocketMQConsumer(Consumer):
    """One PushConsumer of one group, with one routing callback for all its topics."""

    def __init__(
        self,
        transport: ConsumerHost,
        group: str,
        subscriptions: Sequence[Subscription],
        callback: DeliveryCallback,
        *,
        threads: int,
    ) -> None:
        self.transport = transport
        self.group = group
        self.subscriptions = list(subscriptions)
        self.callback = callback
        self.threads = threads
        self.orderly = all_ordered(group, self.subscriptions, transport.ordered_topics)
        self.send_back = SendBack(transport.admin, group,
                                  patience=transport.send_back_patience)
        self.instance_name = native.new_instance_name("c")
        self._push: Any = None
        self._c_callback: Any = None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._started = False
        self._last_message = time.monotonic()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._failure: str | None = None
        #: times the watchdog rebuilt this consumer after a stall
        self.rebuilds = 0
        #: native consumers replaced by a rebuild whose shutdown did not return (kept alive
        #: with their callbacks: the C++ threads may still call them)
        self._retired: list[tuple[Any, Any]] = []
        self._hung = False
        #: held while the watchdog swaps the native consumer, so shutdown never misses one
        self._swap = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def start(self) -> None:
        """Configure the group and topics when asked to, then start the PushConsumer.

        Raises:
            TransportUnavailable: the broker cannot be reached.
            ConfigError: librocketmq is missing, or reads bodies cut (`native.check_body_layout`).
        """
        if self._started:
            return
        transport = self.transport
        native.check_body_layout()
        if transport.create_topics:
            for sub in self.subscriptions:
                transport.ensure_topic(sub.topic)
        else:  # a 4.x consumer of a topic without a route waits for it, where 5.x fails
            for topic in transport.missing_topics([s.topic for s in self.subscriptions]):
                log.warning("consumer %s: topic %s does not exist (no route): it waits for "
                            "it (create it first, or create_topics=True)", self.group, topic)
        transport.prepare_group(self.group)
        if not self.orderly:
            self.send_back.limit()  # known before the first delivery (Delivery.max_reconsume_times)
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._push = self._start_push()
        except Exception:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            raise
        self._started = True
        self._last_message = time.monotonic()
        topics = ", ".join(f"{s.topic}[{s.expression}]" for s in self.subscriptions)
        log.info("consumer %s (%s) started on %s: %s", self.group, self.instance_name,
                 transport.addr, topics)
        if transport.stall_after > 0:
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name=f"ckit-rmq-watch-{self.group}")
            self._watchdog.start()

    def _start_push(self) -> Any:
        """A started native PushConsumer under `instance_name`, calling `_on_message`."""
        transport = self.transport
        client = native.client()
        push = client.PushConsumer(self.group, orderly=self.orderly)
        push.set_name_server_address(for_native(transport.addr))
        push.set_instance_name(self.instance_name)
        push.set_thread_count(self.threads)
        push.set_message_batch_max_size(1)
        native.configure_client_log(push._handle, kind="PushConsumer",
                                    path=transport.client_log_dir,
                                    level=transport.client_log_level)
        self._c_callback = native.subscribe_one_callback(
            push, [(s.topic, s.expression or "*") for s in self.subscriptions],
            self._on_message, orderly=self.orderly)
        try:
            push.start()
        except Exception as exc:
            raise translate(exc, f"starting consumer {self.group}") from exc
        return push

    # -- liveness -------------------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        return self._failure

    def _watch(self) -> None:
        """Every few seconds: idle for `stall_after` while the broker holds a backlog in the
        queues this consumer owns? Rebuild it (up to `max_rebuilds` times), then give up."""
        stall_after = self.transport.stall_after
        topics = [*(s.topic for s in self.subscriptions), retry_topic(self.group)]
        refused_warned = False
        while not self._stopping.wait(min(5.0, max(0.2, stall_after / 4))):
            if self._in_flight:  # read first: a callback stamps its return before leaving
                continue
            idle = time.monotonic() - self._last_message
            if idle < stall_after:
                continue
            try:
                backlog = owned_backlog(self.transport.admin, self.group, topics,
                                        self.instance_name)
            except TransportUnavailable as exc:  # away: the client reconnects by itself
                log.debug("consumer %s: liveness check failed: %s", self.group, exc)
                continue
            except TransportError as exc:  # it answered but refused: the watchdog is blind
                warned = refused_warned
                refused_warned = True
                (log.debug if warned else log.warning)(
                    "consumer %s: the broker refused the liveness check (%s): a stall of this "
                    "consumer cannot be detected while it does", self.group, exc)
                continue
            refused_warned = False
            if not backlog.stalled_if_idle or self._stopping.is_set():
                continue
            if self._in_flight or time.monotonic() - self._last_message < stall_after:
                continue  # a message came while the broker was asked: not stalled
            where = (f"{backlog.owned} in its queues" if backlog.registered else
                     f"{backlog.total} for the group, and it lists no heartbeat of this consumer")
            if self.rebuilds >= self.transport.max_rebuilds:
                STALLS.labels(self.group, "exit").inc()
                self._failure = (f"consumer {self.group} ({self.instance_name}) received nothing "
                                 f"for {idle:.0f}s while the broker holds {where}, after "
                                 f"{self.rebuilds} rebuild(s): exiting so that a supervisor "
                                 "restarts the process")
                log.error("%s", self._failure)
                return
            STALLS.labels(self.group, "rebuild").inc()
            log.error("consumer %s (%s): received nothing for %.0fs while the broker holds %s: "
                      "stalled; rebuilding the native consumer (%d of %d)", self.group,
                      self.instance_name, idle, where, self.rebuilds + 1,
                      self.transport.max_rebuilds)
            self._rebuild()

    def _rebuild(self) -> None:
        """Replace the native consumer by a new one (a new client id); the old one is shut down
        with a bound, and kept alive if its shutdown does not return."""
        with self._swap:
            if self._stopping.is_set():
                return
            self.rebuilds += 1
            old, old_callback = self._push, self._c_callback
            if old is not None and not self._stop_push(old, DEFAULT_SHUTDOWN_TIMEOUT):
                self._retired.append((old, old_callback))
            self.instance_name = native.new_instance_name("c")
            try:
                self._push = self._start_push()
            except Exception as exc:  # any failure: the process exits 3, never sits dead
                self._push = None
                self._failure = f"consumer {self.group}: rebuild after a stall failed: {exc}"
                log.error("%s", self._failure)
                return
            self._last_message = time.monotonic()
        log.warning("consumer %s rebuilt as %s", self.group, self.instance_name)

    def _on_message(self, _consumer: Any, handle: Any) -> int:
        """The ctypes callback: never raises, always answers 0 (success) or 1 (later)."""
        try:
            return self._consume(handle)
        except BaseException:  # last line of defence (e.g. logging failing at interpreter exit)
            return int(ConsumeStatus.RECONSUME_LATER)

    def _consume(self, handle: Any) -> int:
        msg_id = "?"
        with self._lock:
            self._in_flight += 1
        _local.in_callback = True
        try:
            try:
                delivery = self._copy(handle)
            except ValueError as exc:  # a body it cannot decode: no delivery can ever succeed
                return self._dead_letter(handle, f"undecodable body: {exc}")
            except BaseException:
                log.exception("consumer %s: cannot read a message; reconsume later", self.group)
                return int(ConsumeStatus.RECONSUME_LATER)
            msg_id = delivery.properties.get(PROP_ID) or delivery.broker_message_id
            try:
                verdict = as_verdict(self.callback(delivery))
            except BaseException as exc:
                log.exception("consumer %s: message %s: callback failed; reconsume later",
                              self.group, msg_id)
                verdict = Verdict(ConsumeStatus.RECONSUME_LATER,
                                  f"{type(exc).__name__}: {exc}")
            if verdict.status is ConsumeStatus.CONSUME_SUCCESS:
                return int(ConsumeStatus.CONSUME_SUCCESS)
            if self.orderly:
                log.debug("consumer %s: message %s: reconsume later (ordered)", self.group, msg_id)
                return int(ConsumeStatus.RECONSUME_LATER)
            return self._send_back(handle, delivery, msg_id, verdict)
        finally:
            _local.in_callback = False
            # idle counts from the return (the offset is committed up to 5 s after it), stamped
            # before the count drops so that the watchdog never sees neither
            self._last_message = time.monotonic()
            with self._lock:
                self._in_flight -= 1

    def _send_back(self, handle: Any, delivery: Delivery, msg_id: str, verdict: Verdict
                   ) -> int:
        """Send a failed message back ourselves and answer success, so that the native client
        never sends its batch neighbours back; RECONSUME_LATER only when that fails."""
        reason = verdict.reason
        try:
            offset = native.commit_log_offset(handle)
            sent = self.send_back.send_back(delivery, offset, reason, spend=verdict.spend,
                                            until=self._stopping.is_set)
        except Exception as exc:
            log.error("consumer %s: message %s: could not send it back (%s); answering "
                      "RECONSUME_LATER: the native client sends back this message and the rest "
                      "of its batch", self.group, msg_id, exc)
            return int(ConsumeStatus.RECONSUME_LATER)
        if sent.delay_level:
            log.info("consumer %s: message %s failed (%s): reconsume %d at delay level %d",
                     self.group, msg_id, reason or "no reason given", sent.reconsume_times,
                     sent.delay_level)
        else:
            log.warning("consumer %s: message %s moved to %s after %d reconsumes: %s",
                        self.group, msg_id, sent.topic, sent.reconsume_times - 1,
                        reason or "no reason given")
        return int(ConsumeStatus.CONSUME_SUCCESS)

    def _dead_letter(self, handle: Any, reason: str) -> int:
        """A message no handler can be given (a body marked base64 that is not): moved to the
        dead-letter queue at once, as stored, with `reason`, and acked. On an ordered queue
        too: retried in place it would hold every message behind it for good (the 4.x
        client's ordered retries have no limit), and no retry can decode it; the messages
        after it go on in their order, as on a 5.x FIFO group."""
        try:
            raw = self._copy(handle, stored=True)
            sent = self.send_back.send_back(raw, native.commit_log_offset(handle), reason,
                                            dead=True, until=self._stopping.is_set)
        except Exception as exc:
            log.error("consumer %s: %s; could not move it to the dead letters (%s): "
                      "reconsume later", self.group, reason, exc)
            return int(ConsumeStatus.RECONSUME_LATER)
        log.error("consumer %s: message %s moved to %s at once: %s", self.group,
                  raw.broker_message_id, sent.topic, reason)
        return int(ConsumeStatus.CONSUME_SUCCESS)

    def _copy(self, handle: Any, *, stored: bool = False) -> Delivery:
        """Copy everything out of the C message (valid only during the callback); `stored`:
        its body as it travelled, not decoded (`make_delivery`).

        Raises:
            ValueError: a body marked base64 that is not (unless `stored`).
        """
        return received_delivery(
            native.client().ReceivedMessage(handle), native.body(handle),
            extra=self.transport.extra_properties,
            max_reconsume_times=None if self.orderly else self.send_back.limit(), stored=stored)

    def shutdown(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
        """Stop the PushConsumer (it lets running callbacks finish and persists offsets).

        Waits up to `timeout` seconds; on a timeout the consumer is left to finish in the
        background (and stays referenced). Must not be called from inside the callback.

        Raises:
            TransportError: called from a consume callback (the C++ client would deadlock).
        """
        if getattr(_local, "in_callback", False):
            raise TransportError(f"consumer {self.group}: shutdown() called from its callback")
        self._stopping.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout)
        with self._swap:  # a rebuild under way finishes first (it is bounded too)
            push, self._push = self._push, None
        if push is None:
            return
        began = time.monotonic()
        if not self._stop_push(push, timeout):
            return  # stays in _LIVE: its callback must outlive the C++ threads
        if not self._retired:
            with _LIVE_LOCK:
                _LIVE.discard(self)
        log.info("consumer %s (%s) shut down in %.2f s", self.group, self.instance_name,
                 time.monotonic() - began)

    @property
    def stuck(self) -> bool:
        """True when a native shutdown did not return (its threads may keep the process up:
        `ckit consume` then exits with `os._exit`)."""
        return self._hung

    def _stop_push(self, push: Any, timeout: float) -> bool:
        """Shut one native consumer down on a helper thread; False when it did not return
        within `timeout` (it is left to finish in the background)."""
        done = threading.Event()

        def stop() -> None:
            try:
                push.shutdown()
                native.destroy_push_consumer(push)  # after a clean shutdown only
            except Exception:
                log.exception("consumer %s: shutdown failed", self.group)
            finally:
                done.set()

        threading.Thread(target=stop, name=f"ckit-rmq-stop-{self.group}", daemon=True).start()
        if done.wait(timeout):
            return True
        self._hung = True
        log.warning("consumer %s: shutdown still running after %.1f s (%d in flight)",
                    self.group, timeout, self._in_flight)
        return False
