"""The Redis fast path: one round trip answers done / busy / claimed.

Redis is an accelerator, never the truth: when it is down or flushed the processed table still
decides. Errors switch the store to degraded mode (a warning and a metric) and it tries Redis
again after `retry_after`, so it recovers by itself.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from urllib.parse import parse_qs, unquote, urlsplit

import redis

from consumer_kit import metrics
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.urls import mask_url
from consumer_kit.dedupe.claims import BY_ANSWER, Claim, key_error
from consumer_kit.dedupe.combining import Combiner
from consumer_kit.dedupe.keys import done_key, lease_key
from consumer_kit.dedupe.pending import PendingClaim
from consumer_kit.dedupe.scripts import Call, LuaScript, run_pipelined
from consumer_kit.dedupe.writer import RedisWriter

log = logging.getLogger(__name__)

DEFAULT_DONE_TTL = dt.timedelta(days=7)
DEFAULT_LEASE = dt.timedelta(minutes=2)
DEFAULT_RETRY_AFTER = 5.0
#: seconds between the warnings of one Redis outage that goes on
REMIND_EVERY = 300.0
#: The shortest handler lease and done-marker lifetime accepted (Redis refuses a PX of 0, and a
#: lease renewed faster than a round trip is a busy loop).
MIN_REDIS_TTL = dt.timedelta(seconds=1)


def check_redis_times(lease: object, done_ttl: object) -> None:
    """Refuse a handler lease or done-marker lifetime Redis cannot keep, before anything runs.

    Raises:
        ConfigError: not a timedelta of at least `MIN_REDIS_TTL`.
    """
    for name, value in (("lease", lease), ("done_ttl", done_ttl)):
        if not isinstance(value, dt.timedelta) or value < MIN_REDIS_TTL:
            raise ConfigError(f"{name} must be a timedelta of at least "
                              f"{MIN_REDIS_TTL.total_seconds():g} s, not {value!r}")


def check_redis_option(value: object) -> None:
    """Refuse a `ConsumerApp(redis=...)` that could never work: neither a URL, a `redis.Redis`
    client nor None (an asyncio client's PING "answers" with a coroutine at start, then every
    claim fails and every message goes back to the broker), or a Redis URL whose path redis-py
    would read as no database at all: it connects to database 0 then, without a word
    (`redis://host/staging`, `/db1`, a raw `@` in the password that makes the rest of the URL
    a path), so two apps meant apart share their keys.

    Raises:
        ConfigError: such a value; a `redis://` or `rediss://` URL with a path that is not a
            database number and no `?db=`.
    """
    if value is None or isinstance(value, redis.Redis):
        return
    if not isinstance(value, str):
        raise ConfigError(f"redis= must be a Redis URL, a redis.Redis client or None, not "
                          f"{type(value).__module__}.{type(value).__name__}")
    url = value
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or "db" in parse_qs(parts.query):
        return  # (redis-py refuses a scheme it does not know, and a `?db=` not a number)
    path = unquote(parts.path).replace("/", "")  # as redis-py reads it
    try:
        if path:
            int(path)
    except ValueError:
        raise ConfigError(f"redis URL {mask_url(url)!r}: its path is not a database number "
                          "(redis-py would connect to database 0): use redis://host:port/N "
                          "(a raw '@', ':' or '/' in the password is written %40, %3A, %2F)"
                          ) from None


class RedisDedupe:
    """Claims, finishes, renews and releases message ids of one consumer group in Redis."""

    def __init__(
        self,
        client: redis.Redis,
        group: str,
        *,
        lease: dt.timedelta = DEFAULT_LEASE,
        done_ttl: dt.timedelta = DEFAULT_DONE_TTL,
        retry_after: float = DEFAULT_RETRY_AFTER,
    ) -> None:
        check_redis_times(lease, done_ttl)
        self.client = client
        self.group = group
        self.lease_ms = int(lease.total_seconds() * 1000)
        self.done_ms = int(done_ttl.total_seconds() * 1000)
        # the scripts' ARGV, as text (`scripts.evalsha`)
        self._lease_text, self._done_text = str(self.lease_ms), str(self.done_ms)
        self.retry_after = retry_after
        self._claim = LuaScript(client, "claim.lua")
        # Concurrent claims from the consume threads share one pipelined round trip; a send
        # that hangs would hold them all, so the client needs a socket timeout.
        self._claims: Combiner[tuple[str, str], int | Exception] = Combiner(self._send_claims)
        if client.connection_pool.connection_kwargs.get("socket_timeout") is None:
            log.warning("redis client for group %s has no socket_timeout: a hung Redis would "
                        "block every consume thread (ConsumerApp sets 0.5 s for URLs)", group)
        self._finish = LuaScript(client, "finish.lua")
        self._release = LuaScript(client, "release.lua")
        self._renew = LuaScript(client, "renew.lua")
        self._down_until = 0.0
        #: failed since the last answer (an outage outlasts many `retry_after` windows: it is
        #: warned once, then every `REMIND_EVERY` seconds, not at each window's failed retry)
        self._outage = False
        self._warned_at = 0.0
        #: failures recorded so far: an answer to a request sent before the last failure does
        #: not prove Redis is back (it was read from the socket's buffer)
        self.failures = 0
        self._lock = threading.Lock()
        self.writer = RedisWriter(client, on_error=lambda exc: self._failed("write", "-", exc),
                                  on_ok=self._ok, generation=lambda: self.failures,
                                  hold=lambda: self._down_until - time.monotonic())

    @property
    def degraded(self) -> bool:
        """True while Redis is considered down (the database path alone decides)."""
        return time.monotonic() < self._down_until

    def claim_call(self, message_id: str, token: str, finished: Sequence[Call] = ()) -> Call:
        """The claim script's call (for `PendingClaim`, which sends it itself). It runs the
        done markers of `finished` first, in the same script (one answer for all): calls
        `finish` queued (`RedisWriter.take`). A marker's keys share the claim's hash slot (the
        group's), so the script runs on a cluster too.

        Raises:
            ValueError: a call in `finished` is not `finish`'s.
        """
        keys = [done_key(self.group, message_id), lease_key(self.group, message_id)]
        args = [token, self._lease_text]
        for script, marker_keys, marker_args in finished:
            if script is not self._finish:
                raise ValueError(f"a claim carries done markers only, not {script.name}")
            keys.extend(marker_keys)
            args.extend(marker_args)
        return (self._claim, keys, args)

    def claim_later(self, message_id: str, token: str) -> PendingClaim:
        """Send a claim now and read its answer later (`PendingClaim.result`)."""
        if self.degraded:
            return PendingClaim.answered(self, message_id, token, Claim.UNAVAILABLE)
        return PendingClaim(self, message_id, token)

    def failed(self, what: str, message_id: str, exc: Exception) -> None:
        """Redis failed: degrade to the database path for `retry_after` seconds."""
        self._failed(what, message_id, exc)

    def ok(self, since: int) -> None:
        """Redis answered a request sent when `failures` was `since`: leave the degraded mode
        if it was on and no failure was recorded after that request went out."""
        self._ok(since)

    def _failed(self, what: str, message_id: str, exc: Exception) -> None:
        with self._lock:  # the gauge too: an `_ok` in between must not leave it at 1
            now = time.monotonic()
            first = not self._outage
            remind = not first and not self.degraded and now - self._warned_at >= REMIND_EVERY
            if first or remind:
                self._warned_at = now
            self._outage = True
            self.failures += 1
            self._down_until = time.monotonic() + self.retry_after
            metrics.DEGRADED.labels(self.group).set(1)
        if first:
            log.warning("message %s: redis %s failed (%s); degraded to the database path for "
                        "%.0fs", message_id, what, exc, self.retry_after)
        elif remind:
            log.warning("redis still unavailable for group %s (%d failures so far, the latest: "
                        "%s); the database path decides", self.group, self.failures, exc)

    def degrade(self, what: str, exc: Exception) -> None:
        """Treat Redis as down now (e.g. it did not answer at start): the database path decides
        and Redis is tried again after `retry_after`."""
        self._failed(what, "-", exc)

    def _ok(self, since: int) -> None:
        if self._down_until:
            with self._lock:
                if since != self.failures:  # sent before a failure: proves nothing
                    return
                back, self._down_until = bool(self._down_until), 0.0
                self._outage = False
                if back:
                    metrics.DEGRADED.labels(self.group).set(0)
            if back:  # logged outside the lock: a logging handler's lock left held by an
                # interrupted main thread must not leave this store's lock held too
                log.warning("redis is back for group %s; fast path restored", self.group)

    def claim(self, message_id: str, token: str) -> Claim:
        """Take the in-flight lease unless the message is done or leased by someone else."""
        if self.degraded:
            return Claim.UNAVAILABLE
        since = self.failures
        if threading.get_ident() == threading.main_thread().ident:
            # The main thread, the one thread a signal handler can interrupt, never joins the
            # combiner: a handler raising while it held the lead or waited for the combiner's
            # lock would leave the combiner leading with nobody sending, and every consume
            # thread's later claims waiting forever. It sends alone on its own connection.
            answer = self._send_claims([(message_id, token)])[0]
        else:
            answer = self._claims.call((message_id, token))
        if isinstance(answer, redis.ResponseError) and key_error(answer):  # this key alone
            log.warning("message %s: redis claim failed (%s); the processed table decides",
                        message_id, answer)
            return Claim.UNAVAILABLE
        if isinstance(answer, Exception):  # Redis is away (connection, timeout, OOM,
            # READONLY: every key's claim would fail the same way): degrade
            self._failed("claim", message_id, answer)
            return Claim.UNAVAILABLE
        self._ok(since)
        return BY_ANSWER[answer]

    def _send_claims(self, claims: Sequence[tuple[str, str]]) -> list[int | Exception]:
        """Run the claim script for each (message id, token) in one pipelined round trip.
        Errors come back as values, one per claim (a connection error: the same for all)."""
        calls = [self.claim_call(message_id, token) for message_id, token in claims]
        try:
            answers = run_pipelined(self.client, calls)
        except redis.RedisError as exc:
            return [exc] * len(claims)
        return [a if isinstance(a, Exception) else int(a) for a in answers]

    def finish(self, message_id: str, token: str) -> None:
        """Mark done (TTL) and drop our lease, off the hot path: queued for the next claim to
        carry, or the writer thread to send (see `RedisWriter`). Lost, it only costs a
        database lookup for the next duplicate. Queued while degraded too: a lease taken
        before the failure would otherwise answer duplicates BUSY for the whole lease (a
        failing batch holds up no consume thread; one Redis takes ends the degraded mode)."""
        self.writer.submit(self._finish, [done_key(self.group, message_id),
                                          lease_key(self.group, message_id)],
                           [token, self._done_text])

    def release(self, message_id: str, token: str) -> None:
        """Drop our lease now, so a redelivery can be processed at once. Synchronous: it runs
        only after a failure, and a redelivery must not find the lease still held. While
        degraded it goes to the writer thread instead (no consume thread waits on a Redis that
        may be hung): a lease taken before another thread's failure (Redis up, the store
        degraded for `retry_after`) would otherwise answer the redelivery BUSY for the whole
        lease."""
        if self.degraded:
            self.writer.submit(self._release, [lease_key(self.group, message_id)], [token],
                               ride=False)
            return
        try:
            self._release([lease_key(self.group, message_id)], [token])
        except redis.RedisError as exc:
            self._failed("release", message_id, exc)

    def renew(self, message_id: str, token: str) -> bool:
        """Extend our handler lease by a whole lease (a handler still running); False when it
        is not ours any more or Redis is away."""
        if self.degraded:
            return False
        try:
            return bool(self._renew([lease_key(self.group, message_id)],
                                    [token, self._lease_text]))
        except redis.RedisError as exc:
            self._failed("renew", message_id, exc)
            return False

    def flush(self, timeout: float = 5.0) -> bool:
        """Send the queued done markers now (see `RedisWriter.flush`)."""
        return self.writer.flush(timeout)

    def close(self) -> None:
        """Send queued writes and stop the writer thread. The connections threads keep for the
        client stay theirs (the client may be shared): its owner calls `release_kept` once no
        thread uses it any more (`ConsumerApp.close` does, for a client it made)."""
        self.writer.close()
