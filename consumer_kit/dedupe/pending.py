"""A Redis claim sent now and read later, so its round trip overlaps the database's.

For a message that is most likely new, the pipeline sends the claim, inserts the processed row
(a round trip of its own), and only then reads the claim's answer: the two waits overlap, and
the Redis fast path costs what the database-only path costs. A duplicate still learns it at
once from the processed row's unique key, and Redis' answer rolls the transaction back when
the message is done or another consumer holds it. While duplicates are frequent the pipeline
claims first instead (`Predictor`), so they never reach the database.

The claim carries the done markers queued since the last one (`RedisWriter.take`): the claim
script runs them first (`RedisDedupe.claim_call`), so they cost no round trip, wake no thread,
and add no answer to read: one answer says how the claim went and how many markers failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from consumer_kit.dedupe.claims import BY_ANSWER, Claim, key_error
from consumer_kit.dedupe.scripts import Call, begin_call, pack_calls, thread_connection
from consumer_kit.dedupe.writer import RedisWriter

log = logging.getLogger(__name__)

#: Weight of the newest answer in the duplicate rate; above the threshold, claim first.
SMOOTHING = 0.05
THRESHOLD = 0.2


class ClaimSource(Protocol):
    """What a pending claim needs of its `RedisDedupe`."""

    client: redis.Redis
    writer: RedisWriter

    def claim_call(self, message_id: str, token: str, finished: Sequence[Call] = ()
                   ) -> Call: ...

    def claim(self, message_id: str, token: str) -> Claim: ...

    def failed(self, what: str, message_id: str, exc: Exception) -> None: ...

    failures: int

    def ok(self, since: int) -> None: ...


#: Each thread's claim whose answer is not read yet (see `PendingClaim.__init__`), by thread
#: id: not a `threading.local`, which the C++ client's callback threads lose between callbacks
#: (`consumer_kit.dedupe.scripts.thread_connection`).
_on_wire: dict[int, PendingClaim] = {}


class PendingClaim:
    """A claim on the wire; `result()` reads its answer once.

    It goes on a connection the calling thread keeps for its claims (no pool checkout per
    message), so `result()` belongs to the thread that made the claim. Should a claim be left
    unread, the thread's next claim reads it first, so an answer is never taken for
    another's."""

    def __init__(self, dedupe: ClaimSource, message_id: str, token: str) -> None:
        self.dedupe = dedupe
        self.message_id = message_id
        self.token = token
        self._answer: Claim | None = None
        self._conn: Any = None
        self._thread = threading.get_ident()
        left = _on_wire.get(self._thread)
        if left is not None and left._conn is not None:
            left.result()
        self._since = dedupe.failures  # before it goes out (`ClaimSource.ok`)
        self._riders: list[Call] = dedupe.writer.take()
        try:
            self._conn = conn = thread_connection(dedupe.client.connection_pool, "claims")
            #: its socket answered a claim before: Redis may have closed it since (`result`)
            self._reused = _answered_before(conn)
            begin_call(conn)
            _on_wire[self._thread] = self
            call = dedupe.claim_call(message_id, token, self._riders)
            conn.send_packed_command(pack_calls(conn, [call]))
        except redis.RedisError as exc:
            self._done(clean=False)
            dedupe.failed("claim", message_id, exc)
            self._answer = Claim.UNAVAILABLE
        except BaseException:  # interrupted mid-send: nothing on that socket can be trusted
            self._done(clean=False)
            raise

    @classmethod
    def answered(cls, dedupe: ClaimSource, message_id: str, token: str, answer: Claim
                 ) -> PendingClaim:
        """A claim whose answer is known without asking (Redis is degraded)."""
        pending = cls.__new__(cls)
        pending.dedupe, pending.message_id, pending.token = dedupe, message_id, token
        pending._answer, pending._conn, pending._riders = answer, None, []
        pending._reused = False
        pending._thread = threading.get_ident()
        pending._since = dedupe.failures
        return pending

    def result(self) -> Claim:
        """The claim's answer (read from the wire the first time)."""
        if self._answer is not None:
            return self._answer
        if self._conn is None:  # a read interrupted before (its connection dropped)
            self._answer = Claim.UNAVAILABLE
            return self._answer
        clean = False  # every answer read: the connection may carry the thread's next claim
        try:
            raw = self._conn.read_response()
            clean = True
        except redis.exceptions.NoScriptError:  # Redis lost the script (a restart, a flush)
            # nothing of the script ran: the markers wait for the next claim, and this claim
            # goes alone, which loads the script again
            return self._again(clean=True)
        except redis.ConnectionError as exc:
            if not self._reused:  # a new connection failed: Redis is away
                self.dedupe.failed("claim", self.message_id, exc)
                self._answer = Claim.UNAVAILABLE
                return self._answer
            # The kept connection was closed under it (Redis restarted, CLIENT KILL, an idle
            # timeout): that proves nothing of Redis now, and every thread keeps one, so each
            # would degrade the store again after Redis is back. Once more on a new connection
            # (the same token and markers: the scripts are idempotent); a failure then degrades.
            return self._again(clean=False)
        except redis.ResponseError as exc:
            clean = True
            if key_error(exc):  # this key alone
                log.warning("message %s: redis claim failed (%s); the processed table "
                            "decides", self.message_id, exc)
            else:  # Redis refuses every key's claim (OOM, READONLY, ...): degrade, once
                self.dedupe.failed("claim", self.message_id, exc)
            self._answer = Claim.UNAVAILABLE
        except redis.RedisError as exc:  # Redis is away: degrade (the connection is dropped)
            self.dedupe.failed("claim", self.message_id, exc)
            self._answer = Claim.UNAVAILABLE
        else:
            self.dedupe.ok(self._since)
            if self._riders:  # [answer, markers that failed, the first one's error]
                answer, failed, first = raw
                if failed:  # those markers are lost, harmlessly: the processed table decides
                    log.warning("redis done marker failed for %d of %d (%s); the processed "
                                "table decides", int(failed), len(self._riders),
                                first.decode() if isinstance(first, bytes) else first)
                raw = answer
            self._answer = BY_ANSWER[int(raw)]
        finally:
            self._riders = []
            self._done(clean)
        return self._answer

    def _again(self, *, clean: bool) -> Claim:
        """Give up the kept connection (`clean`: every answer on it was read) and claim once
        more, alone; the markers this claim carried wait for the next one."""
        self._done(clean=clean)
        self.dedupe.writer.resubmit(self._riders)
        self._riders = []
        self._answer = self.dedupe.claim(self.message_id, self.token)
        return self._answer

    def _done(self, clean: bool) -> None:
        """Nothing more to read; an unclean connection (answers left unread, a broken
        socket) is closed and reconnects on its next use."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if clean:
                conn.ckit_unread = False  # every answer read (`scripts.begin_call`)
                conn.ckit_answered_on = getattr(conn, "_sock", None)  # (`_answered_before`)
            else:
                conn.disconnect()
        if _on_wire.get(self._thread) is self:
            del _on_wire[self._thread]


def _answered_before(conn: Any) -> bool:
    """Whether `conn`'s socket answered a claim before (`PendingClaim.result` notes it)."""
    sock = getattr(conn, "_sock", None)
    return sock is not None and getattr(conn, "ckit_answered_on", None) is sock


class Predictor:
    """A smoothed rate of duplicates among recent deliveries: above `THRESHOLD` the pipeline
    claims in Redis before touching the database."""

    def __init__(self) -> None:
        self.rate = 0.0
        self._lock = threading.Lock()

    def expect_new(self) -> bool:
        """True while duplicates are rare."""
        return self.rate < THRESHOLD

    def saw(self, duplicate: bool) -> None:
        """Record one delivery's answer."""
        with self._lock:
            self.rate += SMOOTHING * ((1.0 if duplicate else 0.0) - self.rate)
