"""Running one listener for one message: the handler and its processed row in one transaction
(or, without a session, the handler then its row), the handler deadline, and what an exception
means.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import traceback

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from consumer_kit.calling import call, unwrapped
from consumer_kit.control import InvalidBody, Reject, Retry, reason_of
from consumer_kit.core import checkin, tracked
from consumer_kit.core.db import causal_reads, is_galera_node
from consumer_kit.core.db_errors import describe, is_conflict, is_transient
from consumer_kit.core.raised import describe_exception
from consumer_kit.core.schema import REASON_LEN, ProcessedStatus
from consumer_kit.dedupe import Claim, PendingClaim
from consumer_kit.listeners import Listener
from consumer_kit.message import Message
from consumer_kit.outcome import Outcome, Result
from consumer_kit.processed import ProcessedRowGone, ProcessedStore, RowClaim, may_run_again

log = logging.getLogger(__name__)

#: errors that can never succeed on redelivery
DEFAULT_PERMANENT: tuple[type[BaseException], ...] = (
    InvalidBody, json.JSONDecodeError, UnicodeDecodeError,
)


class PastDeadline(Exception):
    """The handler returned after its timeout: its transaction is rolled back."""


class _Ended(Exception):
    """The handler's transaction ended under it: it rolled back its session, or committed the
    session's connection itself (`tx` says which, and whether that commit failed). After a
    rollback, what the processed row reads (`found`, read on the same connection once the
    transaction block is left) says whether a concurrent delivery processed the message."""

    def __init__(self, error: Exception | None, unflushed: bool,
                 tx: tracked.TrackedTransaction) -> None:
        super().__init__("the handler's transaction ended under it")
        #: what the handler raised after that, if anything
        self.error = error
        #: whether its session held changes that were never written
        self.unflushed = unflushed
        #: the transaction that ended: whether the handler's commit of the session's connection
        #: ran (`tx.committed`), what that commit raised if it did (`tx.commit_error`)
        self.tx = tx
        #: the processed row's status, read after a rollback or a failed commit
        self.found: ProcessedStatus | None = None


class Handling:
    """Runs listeners against one group's processed table."""

    def __init__(self, engine: Engine, store: ProcessedStore, *,
                 permanent: tuple[type[BaseException], ...] = ()) -> None:
        self.engine = engine
        self.store = store
        self.permanent = DEFAULT_PERMANENT + tuple(permanent)
        #: listeners warned already about a value their handler returned
        self._warned_returns: set[str] = set()
        #: whether `engine` is a Galera node, once a conflict asked
        self._galera: bool | None = None

    def _returned(self, listener: Listener, value: object) -> None:
        """What a handler returned. A handler returns None and raises `Retry` or `Reject` to
        say otherwise; RECONSUME_LATER (the RocketMQ clients' idiom, any enum of that name) is
        taken as `Retry`, so a ported handler is not acked as a success it did not claim. Any
        other value is ignored, with one warning per listener."""
        if value is None:
            return
        name = getattr(value, "name", None)
        if name == "RECONSUME_LATER":
            raise Retry(f"handler {listener.name} returned RECONSUME_LATER")
        if name == "CONSUME_SUCCESS" or listener.name in self._warned_returns:
            return
        self._warned_returns.add(listener.name)
        log.warning("handler %s returned %r: a handler's return value is ignored, the message "
                    "counts as processed (raise Retry to retry it, Reject to refuse it)",
                    listener.name, value)

    def run(self, listener: Listener, msg: Message, *, receipt: bool,
            past_deadline: object, pending: PendingClaim | None = None) -> Result:
        """Run `listener` for `msg`; `past_deadline()` (a callable) says whether the handler
        overran its timeout; `pending` is a Redis claim sent but not read yet (read once the
        processed row is inserted: the two round trips overlap). SUCCEEDED, DUPLICATE, BUSY,
        REJECTED or RETRY."""
        started = time.monotonic()
        try:
            if listener.wants_session:
                return self._in_transaction(listener, msg, receipt, past_deadline, pending)
            return self._then_record(listener, msg, receipt, past_deadline)
        except PastDeadline:
            return Result(Outcome.RETRY, f"handler {listener.name} ran "
                          f"{time.monotonic() - started:.1f}s, past its timeout of "
                          f"{listener.timeout:g}s: rolled back")

    def _in_transaction(self, listener: Listener, msg: Message, receipt: bool,
                        past_deadline: object, pending: PendingClaim | None) -> Result:
        try:
            # given back without the pool's reset ROLLBACK after its own COMMIT (`checkin`)
            with checkin.connection(self.engine) as conn:
                try:
                    return self._claim_and_run(listener, msg, conn, receipt, past_deadline,
                                               pending)
                except _Ended as ended:  # read on this connection: never a second one
                    if not ended.tx.committed:
                        ended.found = self._recorded(conn, msg)
                    raise
        except _Ended as ended:
            return self._after_ended(listener, msg, ended, receipt)
        except PastDeadline:
            raise
        except ProcessedRowGone as exc:
            return Result(Outcome.RETRY, str(exc))
        except Exception as exc:
            if isinstance(exc, DBAPIError) and is_conflict(exc, self.engine.dialect.name):
                lost = self._lost_to_another(msg, exc)
                if lost is not None:
                    return lost
            return self.failure(listener, msg, exc, receipt=receipt)

    def _lost_to_another(self, msg: Message, exc: DBAPIError) -> Result | None:
        """The transaction was rolled back because a concurrent one won (a deadlock; on a
        Galera cluster, a delivery of the same message on another node certified first): a
        DUPLICATE when that was a delivery of `msg` that succeeded, else None (a retry)."""
        try:
            if self._galera is None:
                self._galera = is_galera_node(self.engine)
            with self.engine.connect() as conn, (
                    # the winner's commit on another node may not be applied here yet
                    causal_reads(conn) if self._galera else contextlib.nullcontext()):
                found = self.store.status(msg.id, conn)
        except SQLAlchemyError:  # (a pool timeout too)
            return None  # not known: reconsume later
        if found is not ProcessedStatus.SUCCEEDED:
            return None
        log.info("message %s: recorded by a concurrent delivery, whose transaction won over "
                 "this one's (%s): a duplicate", msg.id, describe(exc))
        return Result(Outcome.DUPLICATE, "recorded by a concurrent delivery")

    def _claim_and_run(self, listener: Listener, msg: Message, conn: Connection,
                       receipt: bool, past_deadline: object,
                       pending: PendingClaim | None) -> Result:
        """The processed row, then the handler, in one transaction on `conn`."""
        with tracked.begin(conn) as tx:
            claim = self.store.claim(conn, msg, ProcessedStatus.SUCCEEDED,
                                     receipt=receipt)
            answer = pending.result() if pending is not None else None
            if claim is RowClaim.NEW and answer in (Claim.DUPLICATE, Claim.BUSY):
                # Redis knows better: done elsewhere (its processed row purged), or
                # another consumer holds the message right now
                tx.rollback()
                if answer is Claim.BUSY:
                    return Result(Outcome.BUSY, "another consumer holds the lease")
                return Result(Outcome.DUPLICATE, "done in redis")
            if claim is RowClaim.NEW:
                self._handle(listener, msg, conn, tx, past_deadline)
                return Result(Outcome.SUCCEEDED)
            tx.rollback()
        claim = self.store.decide(conn, msg)  # the row that clashed, same connection
        if claim is RowClaim.DONE:
            return Result(Outcome.DUPLICATE, "processed row exists")
        if claim is RowClaim.DECIDED:
            return Result(Outcome.DUPLICATE, "rejected before", may_run_again=True)
        # A row without effect that may run again (a dead letter, a re-sent rejection):
        # take it over first, so that a concurrent run waits on its lock.
        with tracked.begin(conn) as tx:
            if not self.store.rerun(conn, msg, ProcessedStatus.SUCCEEDED,
                                    receipt=receipt):
                return Result(Outcome.DUPLICATE, "another run took the failed row")
            self._handle(listener, msg, conn, tx, past_deadline)
            return Result(Outcome.SUCCEEDED, "ran again after a rejection or dead letter")

    def _handle(self, listener: Listener, msg: Message, conn: Connection,
                tx: tracked.TrackedTransaction, past_deadline: object) -> None:
        with Session(bind=conn) as session:
            try:
                self._returned(listener, call(listener.fn, msg, session))
            except Exception as exc:  # (a handler's other BaseException too: `calling.Raised`)
                if not conn.in_transaction():
                    raise _Ended(exc, _unflushed(session), tx) from exc
                raise
            if not conn.in_transaction():
                raise _Ended(None, _unflushed(session), tx)
            session.flush()
        if callable(past_deadline) and past_deadline():
            raise PastDeadline  # the transaction (still open) is rolled back by the caller

    def _recorded(self, conn: Connection, msg: Message) -> ProcessedStatus | None:
        """After the handler's transaction ended under it without a commit of its own: the
        processed row's status, read on `conn`. SUCCEEDED is a concurrent delivery's, which
        inserted the row once this transaction's rollback let go of it. None when not known
        (the rollback's path, a reconsume, loses nothing)."""
        try:
            if conn.get_transaction() is not None:  # a failed commit leaves it to roll back
                conn.rollback()
            return self.store.status(msg.id, conn)
        except SQLAlchemyError:
            return None

    def _after_ended(self, listener: Listener, msg: Message, ended: _Ended,
                     receipt: bool) -> Result:
        """What a transaction that ended under the handler means (`_Ended`)."""
        if ended.tx.committed:
            return self._committed_itself(listener, msg, ended, receipt)
        how = "rolled back its session"
        if ended.tx.commit_error is not None:
            how = (f"committed the session's connection, and the commit failed "
                   f"({describe(ended.tx.commit_error)})")
        if ended.found is ProcessedStatus.SUCCEEDED:
            return self._processed_meanwhile(listener, msg, ended, how)
        if ended.error is not None:
            return self.failure(listener, msg, ended.error, receipt=receipt)
        # the rollback took the processed row with the handler's writes: a success now would
        # ack the broker with nothing recorded
        log.warning("message %s: handler %s %s; nothing was recorded, reconsume later", msg.id,
                    listener.name, how)
        return self.failure(listener, msg, Retry(
            f"handler {listener.name} {how}: nothing was recorded (raise Reject to refuse a "
            "message, Retry to try later)"), receipt=receipt)

    def _processed_meanwhile(self, listener: Listener, msg: Message, ended: _Ended,
                             how: str) -> Result:
        """The handler's transaction ended without its commit, and the processed row reads
        SUCCEEDED: a concurrent delivery of the message, waiting on the row's lock, inserted
        and committed it once this transaction let go of it. A duplicate: acked, with no
        receipt or success of its own, whatever the handler raised after (a retry would only
        find the row). A commit that lost its connection may have taken effect (its answer
        lost): a duplicate all the same, said so."""
        raised = unwrapped(ended.error) if ended.error is not None else None
        then = (f", then raised ({describe(raised)})"
                if raised is not None and raised is not ended.tx.commit_error else "")
        what = ("the message was processed by a concurrent delivery meanwhile (its processed row "
                "committed once this transaction let go of it): a duplicate")
        why = "processed by a concurrent delivery"
        lost = ended.tx.commit_error
        if isinstance(lost, DBAPIError) and lost.connection_invalidated:
            what = ("the processed row reads SUCCEEDED: that commit took effect before the "
                    "connection was lost, or the message was processed by a concurrent delivery: "
                    "a duplicate either way")
            why = "processed: by its own commit whose answer was lost, or a concurrent delivery"
        log.warning("message %s: handler %s %s%s; %s, nothing to retry", msg.id, listener.name,
                    how, then, what)
        return Result(Outcome.DUPLICATE, why)

    def _committed_itself(self, listener: Listener, msg: Message, ended: _Ended,
                          receipt: bool) -> Result:
        """The handler committed the session's connection: the processed row with it."""
        if ended.error is None and not ended.unflushed:
            log.warning("message %s: handler %s committed the session's connection itself: its "
                        "writes and the processed row were committed then; leave the commit to "
                        "the framework (session.commit() is safe)", msg.id, listener.name)
            return Result(Outcome.SUCCEEDED)
        after = (f"then raised ({describe(unwrapped(ended.error))})" if ended.error is not None
                 else "then changed its session, never written")
        log.error("message %s: handler %s committed the session's connection itself, %s: the "
                  "processed row and the writes made before that commit stay committed, so the "
                  "message counts as processed (a redelivery is a duplicate) and what the "
                  "handler meant to do after it is lost. Leave the commit to the framework "
                  "(session.commit() is safe)", msg.id, listener.name, after)
        if ended.error is not None:
            return self.failure(listener, msg, ended.error, receipt=receipt)
        return Result(Outcome.SUCCEEDED)

    def _then_record(self, listener: Listener, msg: Message, receipt: bool,
                     past_deadline: object) -> Result:
        try:
            found = self.store.status(msg.id)
            if found is not None and not may_run_again(found, msg):
                return Result(Outcome.DUPLICATE, "processed row exists",
                              may_run_again=found is not ProcessedStatus.SUCCEEDED)
            self._returned(listener, call(listener.fn, msg))
        except Exception as exc:
            return self.failure(listener, msg, exc, receipt=receipt)
        if callable(past_deadline) and past_deadline():
            log.warning("message %s: handler %s (without a session) finished past its timeout; "
                        "its effect stays (at-least-once)", msg.id, listener.name)
        try:
            if not self.store.record(msg, ProcessedStatus.SUCCEEDED, receipt=receipt):
                log.warning("message %s: processed concurrently by another consumer "
                            "(a handler without a session is at-least-once)", msg.id)
        except DBAPIError as exc:
            return Result(Outcome.RETRY, f"{_unrecorded(exc)} after the handler: {exc.orig}")
        except ProcessedRowGone as exc:
            return Result(Outcome.RETRY, str(exc))
        return Result(Outcome.SUCCEEDED)

    def failure(self, listener: Listener | None, msg: Message, exc: BaseException, *,
                receipt: bool) -> Result:
        """What an exception from a handler means: REJECTED (recorded), else RETRY. (A
        `calling.Raised` is taken as the exception it carries.)"""
        exc = unwrapped(exc)
        permanent = self.permanent + (listener.permanent if listener else ())
        if isinstance(exc, Reject):
            return self.reject(msg, reason_of(exc), receipt=receipt)
        if isinstance(exc, Retry):  # asked for, whatever `permanent_errors=` holds (Exception)
            wish = f" (asked for a delay of {exc.delay})" if exc.delay is not None else ""
            return Result(Outcome.RETRY, reason_of(exc) + wish)
        if isinstance(exc, permanent) and not (  # an outage, a lock timeout, a deadlock:
                # never the message's fault, whatever `permanent_errors=` holds
                isinstance(exc, DBAPIError) and is_transient(exc, self.engine.dialect.name)):
            return self.reject(msg, describe_exception(exc), receipt=receipt)
        name = listener.name if listener else "?"
        if isinstance(exc, DBAPIError):  # an outage, or the handler's own SQL (a missing table)
            log.warning("message %s: handler %s: database error, reconsume later: %s", msg.id,
                        name, exc.orig or exc)
            return Result(Outcome.RETRY, f"database error: {exc.orig or exc}")
        log.warning("message %s: handler %s raised, reconsume later:\n%s", msg.id, name,
                    from_the_handler(exc))
        return Result(Outcome.RETRY, describe_exception(exc))

    def reject(self, msg: Message, reason: str, *, receipt: bool) -> Result:
        """Record FAILED with the reason (durably) before the broker is acked."""
        try:
            if not self.store.record(msg, ProcessedStatus.FAILED, reason[:REASON_LEN],
                                     receipt=receipt):
                return self._recorded_before(msg)
        except DBAPIError as exc:
            return Result(Outcome.RETRY, f"{_unrecorded(exc)} to record a reject: {exc.orig}")
        except ProcessedRowGone as exc:
            return Result(Outcome.RETRY, str(exc))
        return Result(Outcome.REJECTED, reason)

    def dead_letter(self, msg: Message, reason: str, *, receipt: bool) -> Result:
        """The last attempt failed: record FAILED with why, so the reason reaches the producer
        (a rejected receipt) while the transport moves the message to the dead letters."""
        why = f"retries spent after {msg.reconsume_times + 1} deliveries: {reason}"
        try:
            if not self.store.record(msg, ProcessedStatus.DEAD_LETTERED, why[:REASON_LEN],
                                     receipt=receipt):
                return self._recorded_before(msg)
        except DBAPIError as exc:
            return Result(Outcome.RETRY, f"{reason} ({_unrecorded(exc)} to record the dead "
                          f"letter: {exc.orig})")
        except ProcessedRowGone as exc:
            return Result(Outcome.RETRY, f"{reason} ({exc})")
        return Result(Outcome.DEAD_LETTER, why)

    def _recorded_before(self, msg: Message) -> Result:
        """Another run recorded `msg` first (a concurrent delivery whose handler also failed,
        once this one's row lock was gone): a duplicate, but done only when that run
        succeeded. A rejection or a dead letter may run again (an operator's re-send), so it
        must leave no done marker and no memory of a finished id behind."""
        try:
            found = self.store.status(msg.id)
        except DBAPIError:
            found = None  # not known: never claim done
        return Result(Outcome.DUPLICATE, "processed row exists",
                      may_run_again=found is not ProcessedStatus.SUCCEEDED)


#: this package's folder: frames in it are the framework's
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def from_the_handler(exc: BaseException) -> str:
    """`exc` with its traceback from the handler's own frames on: the framework's frames that
    called the handler, the same in every message's traceback, are left out (frames of the
    framework the handler called stay; an error raised in the framework alone keeps them all).
    """
    formatted = traceback.TracebackException.from_exception(exc)
    frames = list(formatted.stack)
    first = next((i for i, frame in enumerate(frames)
                  if not os.path.abspath(frame.filename).startswith(_PACKAGE)), 0)
    formatted.stack = traceback.StackSummary.from_list(frames[first:])
    return "".join(formatted.format()).rstrip()


def _unrecorded(exc: DBAPIError) -> str:
    """Why a processed row was not written: a data error (the database refused the row's
    values: every attempt fails the same way, it is no outage) or the database unavailable.
    The outcome is a retry either way; only the reason differs."""
    if isinstance(exc, DataError):
        return "the database refused the row's values (a data error, not an outage)"
    return "database unavailable"


def _unflushed(session: Session) -> bool:
    """Whether `session` holds changes it never wrote."""
    return bool(session.new or session.dirty or session.deleted)
