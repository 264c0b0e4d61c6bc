"""A Redis claim sent now and read later, so its round trip overlaps the database's.

For a message that is most likely new, the pipeline sends the claim, inserts the processed row
(a round trip of its own), and only then reads the claim's answer: the two waits overlap, and
the Redis fast path costs what the database-only path costs. A duplicate still learns it at
once from the processed row's unique key, and Redis' answer rolls the transaction back when
the message is done or another consumer holds it. While duplicates are frequent the pipeline
claims first instead (`Predictor`), so they never reach the database.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

import redis

from consumer_kit.dedupe.claims import Claim

log = logging.getLogger(__name__)

#: Weight of the newest answer in the duplicate rate; above the threshold, claim first.
SMOOTHING = 0.05
THRESHOLD = 0.2


class ClaimSource(Protocol):
    """What a pending claim needs of its `RedisDedupe`."""

    client: redis.Redis

    def claim_args(self, message_id: str, token: str) -> list[Any]: ...

    def claim(self, message_id: str, token: str) -> Claim: ...

    def failed(self, what: str, message_id: str, exc: Exception) -> None: ...

    def ok(self) -> None: ...


class PendingClaim:
    """A claim on the wire; `result()` reads its answer once (and returns the connection)."""

    def __init__(self, dedupe: ClaimSource, message_id: str, token: str) -> None:
        self.dedupe = dedupe
        self.message_id = message_id
        self.token = token
        self._answer: Claim | None = None
        self._conn: Any = None
        try:
            self._conn = dedupe.client.connection_pool.get_connection()
            self._conn.send_command("EVALSHA", *dedupe.claim_args(message_id, token))
        except redis.RedisError as exc:
            self._release()
            dedupe.failed("claim", message_id, exc)
            self._answer = Claim.UNAVAILABLE

    @classmethod
    def answered(cls, dedupe: ClaimSource, message_id: str, token: str, answer: Claim
                 ) -> PendingClaim:
        """A claim whose answer is known without asking (Redis is degraded)."""
        pending = cls.__new__(cls)
        pending.dedupe, pending.message_id, pending.token = dedupe, message_id, token
        pending._answer, pending._conn = answer, None
        return pending

    def result(self) -> Claim:
        """The claim's answer (read from the wire the first time)."""
        if self._answer is not None:
            return self._answer
        try:
            raw = self._conn.read_response()
        except redis.exceptions.NoScriptError:  # Redis lost the script (a restart, a flush)
            self._release()
            self._answer = self.dedupe.claim(self.message_id, self.token)
            return self._answer
        except redis.ResponseError as exc:  # this key alone (e.g. WRONGTYPE)
            log.warning("message %s: redis claim failed (%s); the processed table decides",
                        self.message_id, exc)
            self._answer = Claim.UNAVAILABLE
        except redis.RedisError as exc:  # Redis is away: degrade, and drop this connection
            self._conn.disconnect()
            self.dedupe.failed("claim", self.message_id, exc)
            self._answer = Claim.UNAVAILABLE
        else:
            self.dedupe.ok()
            self._answer = Claim(int(raw))
        finally:
            self._release()
        return self._answer

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self.dedupe.client.connection_pool.release(conn)


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
