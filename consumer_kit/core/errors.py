"""The one error tree of consumer-kit: everything the library raises derives from `CkitError`.

Control-flow exceptions a handler raises on purpose (`Reject`, `Retry`) are not failures and live
in `consumer_kit.control`.

    CkitError
    ├── ConfigError                  a setting, URL, name or option is invalid (before any work)
    │   └── HandlerSignatureError
    ├── SchemaError                  a table is missing: run `ckit db init`
    ├── DatabaseUnavailable          the database cannot be reached right now
    ├── TransportError               a send or subscribe failed
    │   ├── TransportUnavailable     the broker cannot be reached right now
    │   ├── TransportClosed          the transport was closed: no message is to blame
    │   ├── DuplicateKey             a unique key was taken first (SQL transport)
    │   └── MessageTooLarge          over the transport's size limit: nothing was sent
    ├── OutboxError                  the producer half
    │   ├── PayloadError             a payload or field that cannot be published
    │   ├── PublishConflict          the business key was published for another topic
    │   ├── AmbiguousTarget          an operator argument names rows in several ways
    │   └── ArchiveBusy              another archive run holds the lock
    ├── ReceiptError                 a malformed receipt (logged and skipped, never half-applied)
    └── ReconcileError               a reconcile run failed (committed repairs stay)
"""

from __future__ import annotations


class CkitError(Exception):
    """Root of every error raised by consumer-kit (both halves)."""


class ConfigError(CkitError, ValueError):
    """A setting, URL, table name or option is invalid. The message says which and why."""


class HandlerSignatureError(ConfigError):
    """A listener function has a signature the framework cannot call."""


class SchemaError(CkitError):
    """A table the library needs is missing or does not match; run `ckit db init`."""


class DatabaseUnavailable(CkitError):
    """The database could not be reached or refused the statement for a transient reason."""


class TransportError(CkitError):
    """A transport failed to send or subscribe."""


class TransportUnavailable(TransportError):
    """The broker (or the SQL broker's database) cannot be reached right now; retry later."""


class TransportClosed(TransportError):
    """The transport was closed (e.g. before the dispatcher that sends through it): nothing
    was sent, and no message is to blame, so none is charged a retry."""


class ConsumerStalled(TransportError):
    """A consumer stopped receiving while the broker holds messages for it, and rebuilding it
    did not help: the process should exit (non-zero) so that its supervisor restarts it."""


class DuplicateKey(TransportError):
    """A write hit a primary key or unique index that another writer filled first (the SQL
    transport's database said so); callers that race on purpose treat it as "someone else won"."""


class MessageRefused(TransportError):
    """The transport refuses this message as it is (retrying cannot help); it was not sent."""


class MessageTooLarge(MessageRefused):
    """The message body exceeds the transport's size limit; it was not sent."""


class EmptyBody(MessageRefused):
    """The message body is empty: RocketMQ's clients refuse it; it was not sent."""


class OutboxError(CkitError):
    """Root of the producer half's errors."""


class PayloadError(OutboxError, ValueError):
    """The payload cannot be serialized, or a field is invalid or too long; nothing was written."""


class PublishConflict(OutboxError):
    """The `(biz_type, biz_key)` was already published with another topic; nothing was written
    (the message names the existing message id and its topic)."""


class AmbiguousTarget(OutboxError, ValueError):
    """An operator argument matches a row id, a message id or a biz key of different rows (or
    several rows where one is needed); the message lists them and the prefix that picks one."""


class ArchiveBusy(OutboxError):
    """Another `archive` run holds the lock for this outbox table; try again later."""


class ReceiptError(CkitError, ValueError):
    """A receipt (message) is malformed: it is logged and skipped, never half-applied."""


class ReconcileError(CkitError):
    """The reconcile run failed (a Spark job, a JDBC read). Repairs already committed stay:
    every one of them is a compare-and-set, so running again is safe."""
