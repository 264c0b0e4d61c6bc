"""URL helpers: passwords never leave this module unmasked.

A password is masked wherever it sits and whatever it contains (spaces, `@`, `:`, `/`,
%-escapes): in the userinfo (`scheme://user:PASSWORD@host`) and in the query string
(`?password=`, `&passwd=`, `pwd=`). `mask_url` takes a string known to be one URL; `mask_text`
takes free text (error messages, driver output, log lines) with URLs anywhere in it.

The password runs from the user's first `:` (a user may hold `@`: Azure's `app@server`) to the
last `@` after which a host and a port can be read (`host`, `host:3306` or `[::1]`, then `/`,
`?` or the end), else to the last `@`. SQLAlchemy ends it at the first `@`, but a password
meant with a raw `@` (`p@ss/word@db:3306`: SQLAlchemy reads host `ss`) would leave its tail
in clear, and no rule tells that `@` from one after the database name: an `@` there
(`mysql://app:***@x`, for `app:pw@db:3306/orders@x`) is masked with the password. Masking too
much is safe, too little is not.

Free text has no reliable end for a password that contains whitespace, so every password with
whitespace seen by `mask_url` or `remember_secrets` (the CLI feeds it its arguments and `CKIT_*`
variables) is also masked wherever it appears later. Only those: masking every short password
wherever it appears would blank out ordinary words (a test password `ckit` would turn
`ckit db init` into `*** db init`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from urllib.parse import unquote, unquote_plus

MASK = "***"
#: Query-string parameters that carry a password (any case).
SECRET_PARAMS = ("password", "passwd", "pwd")

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_PARAM = "|".join(SECRET_PARAMS)
#: In one URL: the value runs to the next `&`, `;` or `#` (it may hold spaces).
_QUERY_IN_URL = re.compile(rf"(?i)((?:{_PARAM})=)([^&;#]*)")
#: In free text: the value runs to whitespace, a quote or a separator.
_QUERY_IN_TEXT = re.compile(rf"(?i)((?:{_PARAM})=)([^&;#\s'\"]*)")
#: The user of a URL as SQLAlchemy reads it (it may hold `@`: Azure's `app@server`); in free
#: text it holds no whitespace either.
_USER_IN_URL = re.compile(r"[^:/]*")
_USER_IN_TEXT = re.compile(r"[^:/\s]*")
#: In free text, `scheme://host:port` then a path, whitespace or the end: a port, not a
#: password (a port followed by punctuation is read as a password: masking too much is safe).
_PORT_IN_TEXT = re.compile(r"\d+(?:[/?#\s]|$)")
#: What SQLAlchemy reads after the `@` that ends a password: a host (or `[ipv6]`), maybe a
#: port of digits, then the path, the query or the end of the URL.
_HOST = r"(?:\[[^/?@\]\n]*\]|[^/:?@\n]*)"
_AFTER_AT_IN_URL = re.compile(rf"{_HOST}(?::\d*)?(?:[/?]|$)")
#: In free text the URL may also end after its port (or a bare colon) at a space, a quote or
#: punctuation: "...@db:3306: refused", "...@db: (1045, ...)".
_AFTER_AT_IN_TEXT = re.compile(rf"{_HOST}(?:[/?\n]|$|:\d*(?=[/?\s'\"`),;:.\]]|$))")
#: In free text an `@` followed by a quote never ends a password: a URL's host never starts
#: with one, MySQL's "user 'ckit'@'127.0.0.1'" after the URL always does.
_QUOTES = "'\"`"

_lock = threading.Lock()
_spaced_secrets: set[str] = set()


def mask_url(url: object) -> str:
    """Return `url` with any password replaced by `***`, safe to print, log or write.

    >>> mask_url("mysql+pymysql://app:s3cret@db:3306/orders")
    'mysql+pymysql://app:***@db:3306/orders'
    >>> mask_url("mysql+pymysql://u:p%40ss w:rd@db/x?charset=utf8&password=x2")
    'mysql+pymysql://u:***@db/x?charset=utf8&password=***'
    >>> mask_url("redis://:p@ss/w@redis:6379")  # a raw @ in a password: masked whole
    'redis://:***@redis:6379'
    """
    text = str(url)
    remember_secrets([text])
    span = _password_in_url(text)
    if span is not None:
        text = f"{text[:span[0]]}{MASK}{text[span[1]:]}"
    return _QUERY_IN_URL.sub(_masked_value, text)


def mask_unparsable(url: object) -> str:
    """What may be shown of a URL that could not be parsed: all of it but its password when an
    `@` followed by a host and port that can be read ends it (a raw `@` in the password made
    SQLAlchemy read a port that is not a number), else its scheme and user only (without its
    `@host` no one can tell where a password ends), or its length when it is not a URL (a
    piece of one split at a space).

    >>> mask_unparsable("mysql+pymysql://app:s3cret/orders"), mask_unparsable("cret@db/x")
    ('mysql+pymysql://app:***', '<9 characters, not a URL>')
    >>> mask_unparsable("mysql+pymysql://app:p@ss w:rd@db/orders")
    'mysql+pymysql://app:***@db/orders'
    """
    text = str(url)
    remember_secrets([text])
    match = _SCHEME.match(text.strip())
    if not match:
        return f"<{len(text)} characters, not a URL>"
    span = _password_span(text.strip(), match.end(), in_text=False)
    if span is not None and span[2]:
        return mask_url(text.strip())
    rest = text.strip()[match.end():]
    user = re.split(r"[:@/?#]", rest, maxsplit=1)[0]
    return f"{match.group(0)}{user}:{MASK}" if ":" in rest or "@" in rest else match.group(0) + user


def mask_text(text: object) -> str:
    """Mask every password found anywhere in `text` (error messages, driver output, logs)."""
    masked = str(text)
    with _lock:
        secrets = sorted(_spaced_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in masked:
            masked = masked.replace(secret, MASK)
    pieces: list[str] = []
    done = 0
    for scheme in _SCHEME.finditer(masked):
        span = None if scheme.start() < done else _password_span(masked, scheme.end(),
                                                                 in_text=True)
        if span is not None:
            pieces += [masked[done:span[0]], MASK]
            done = span[1]
    masked = "".join(pieces) + masked[done:]
    return _QUERY_IN_TEXT.sub(_masked_value, masked)


def remember_secrets(values: Iterable[object]) -> None:
    """Remember the passwords with whitespace of every URL in `values`, so `mask_text` masks
    them wherever they show up later (the CLI calls this with its arguments and environment).
    Values that are not URLs are ignored."""
    found: set[str] = set()
    for value in values:
        text = str(value or "")
        if "://" not in text and "=" not in text:
            continue
        found.update(_secrets_of(text))
    spaced = {s for s in found if any(ch.isspace() for ch in s) and len(s.strip()) > 2}
    if spaced:
        with _lock:
            _spaced_secrets.update(spaced)


def _secrets_of(text: str) -> set[str]:
    """Every form (raw, %-decoded, +-decoded) of every password in one URL-like string."""
    raw: list[str] = []
    span = _password_in_url(text)
    if span is not None and span[1] > span[0]:
        raw.append(text[span[0]:span[1]])
    raw += [m.group(2) for m in _QUERY_IN_URL.finditer(text) if m.group(2)]
    forms: set[str] = set()
    for secret in raw:
        forms.update({secret, unquote(secret), unquote_plus(secret)})
    return forms


def _password_in_url(text: str) -> tuple[int, int] | None:
    """(begin, end) of the password of the URL in `text` (`text[begin:end]`), or None."""
    match = _SCHEME.search(text)
    span = None if match is None else _password_span(text, match.end(), in_text=False)
    return None if span is None else span[:2]


def _password_span(text: str, start: int, *, in_text: bool) -> tuple[int, int, bool] | None:
    """(begin, end, read) of the password of the URL whose scheme ends at `start`:
    `text[begin:end]` is the password and `text[end]` the `@` that ends it: the last `@`
    followed by a host and port that can be read; `read` is false when there is none (`end`
    is then the last `@`).
    None: no password (no `user:`, no `@` after it, or in free text `host:port`).

    In free text the password ends on its line, before the next URL's scheme, and never at an
    `@` followed by a quote."""
    user = (_USER_IN_TEXT if in_text else _USER_IN_URL).match(text, start)
    colon = start if user is None else user.end()
    if not text.startswith(":", colon) or (in_text and _PORT_IN_TEXT.match(text, colon + 1)):
        return None
    limit = len(text)
    if in_text:
        next_url = _SCHEME.search(text, colon + 1)
        limit = min(next_url.start() if next_url else limit, _find(text, "\n", colon, limit))
    after = _AFTER_AT_IN_TEXT if in_text else _AFTER_AT_IN_URL
    last = read = -1
    at = text.find("@", colon + 1, limit)
    while at >= 0:
        if not (in_text and text[at + 1:at + 2] and text[at + 1] in _QUOTES):
            if after.match(text, at + 1):
                read = at
            last = at
        at = text.find("@", at + 1, limit)
    if read >= 0:
        return colon + 1, read, True
    return None if last < 0 else (colon + 1, last, False)


def _find(text: str, sub: str, start: int, default: int) -> int:
    """`text.find(sub, start)`, or `default` when it is not there."""
    at = text.find(sub, start)
    return default if at < 0 else at


def _masked_value(match: re.Match[str]) -> str:
    return f"{match.group(1)}{MASK}" if match.group(2) else match.group(0)
