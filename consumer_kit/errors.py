"""The consumer-kit error hierarchy: every error the library raises derives from `CkitError`."""

from __future__ import annotations


class CkitError(Exception):
    """Root of every error raised by consumer-kit (both halves)."""


class ConfigError(CkitError):
    """A setting, URL, table name or option is invalid. The message says which and why."""


class SchemaError(CkitError):
    """A table the library needs is missing or does not match; run `ckit db init`."""


class DatabaseUnavailable(CkitError):
    """The database could not be reached or refused the statement for a transient reason."""


class TransportError(CkitError):
    """A transport failed to send or subscribe."""


class TransportUnavailable(TransportError):
    """The broker (or the SQL broker's database) cannot be reached right now; retry later."""


class DuplicateKey(TransportError):
    """A write hit a primary key or unique index that another writer filled first (the SQL
    transport's database said so); callers that race on purpose treat it as "someone else won"."""


class MessageTooLarge(TransportError):
    """The message body exceeds the transport's size limit; it was not sent."""


class HandlerSignatureError(ConfigError):
    """A listener function has a signature the framework cannot call."""
