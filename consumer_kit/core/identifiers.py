"""Validation of configurable SQL identifiers (table names)."""

from __future__ import annotations

import re

from consumer_kit.core.errors import ConfigError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_identifier(name: str, *, what: str = "table name") -> str:
    """Return `name` when it is a safe SQL identifier, else raise `ConfigError`.

    Only letters, digits and underscores, starting with a letter or underscore, at most 63
    characters (the PostgreSQL limit, stricter than MySQL's 64).

    >>> validate_identifier("ckit_outbox")
    'ckit_outbox'
    """
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigError(
            f"invalid {what} {name!r}: use letters, digits and underscores "
            "(starting with a letter or underscore, at most 63 characters)"
        )
    return name
