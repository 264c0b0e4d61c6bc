"""A root transaction that remembers whether it was committed.

The consumer runs a handler in the transaction of the message's processed row
(`consumer_kit.handling`). A handler that ends that transaction itself leaves the framework to
find out how: committing the session's connection (`session.connection().commit()`) committed
the processed row with it; a rollback (`session.rollback()`, or the connection's) took the row
away, and with it the row's lock, so a concurrent delivery of the same message, waiting on that
lock, inserts and commits its own. The processed row reads SUCCEEDED after either, so it cannot
tell them apart. SQLAlchemy's `Transaction` keeps no record of how it ended, and a `commit`
event listener on each message's connection would cost every message a listen and a remove
(about 9 µs, where the whole SQLite transaction takes 17). `Connection.begin()` is nothing but
`RootTransaction(connection)`, so the consumer begins this subclass instead: every commit of
the transaction goes through its `commit()` (the connection's `commit()`, the context
manager's exit, `get_transaction().commit()`); a session joined to it only ever rolls it back.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection, RootTransaction
from sqlalchemy.exc import InvalidRequestError


class TrackedTransaction(RootTransaction):
    """`connection.begin()`'s transaction, which knows whether its commit ran (`committed`) or
    raised (`commit_error`). Neither: it was rolled back, or is still open."""

    __slots__ = ("commit_error", "committed")

    def __init__(self, connection: Connection) -> None:
        self.committed = False
        #: what its commit raised, if it did (the transaction is over either way)
        self.commit_error: BaseException | None = None
        super().__init__(connection)

    def commit(self) -> None:
        try:
            super().commit()
        except BaseException as exc:
            if self.commit_error is None:  # (a second try only says the first one failed)
                self.commit_error = exc
            raise
        self.committed = True


def begin(connection: Connection) -> TrackedTransaction:
    """`connection.begin()`, as a `TrackedTransaction`.

    Raises:
        InvalidRequestError: `connection` has a transaction already, as `begin()` would.
    """
    if connection.get_transaction() is not None:
        raise InvalidRequestError("This connection has already initialized a SQLAlchemy "
                                  "Transaction() object via begin() or autobegin; can't call "
                                  "begin() here unless rollback() or commit() is called first.")
    return TrackedTransaction(connection)
