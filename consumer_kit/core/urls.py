"""URL helpers: passwords never leave this module unmasked.

A password is masked wherever it sits and whatever it contains (spaces, `@`, `:`, `/`,
%-escapes): in the userinfo (`scheme://user:PASSWORD@host`) and in the query string
(`?password=`, `&passwd=`, `pwd=`). `mask_url` takes a string known to be one URL; `mask_text`
takes free text (error messages, driver output, log lines) with URLs anywhere in it.

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
#: In free text: `scheme://user:` then the password up to the last `@` of the line that is not
#: past another URL's scheme (a password may hold spaces, `@`, `:` and `/`; masking too much
#: of a line is safe, too little is not), and is not followed by a quote: a URL's host never
#: starts with one, MySQL's "user 'ckit'@'127.0.0.1'" after the URL always does (masked, it
#: took the host, the database and the driver's own words with it). `host:port` followed by
#: the end of the URL is not a user and a password.
_USERINFO_IN_TEXT = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?!\d+(?:[/?#\s]|$))"
    r"(?P<pw>(?:(?![A-Za-z][A-Za-z0-9+.\-]*://)[^\n])*)@(?![\'\"`])"
)

_lock = threading.Lock()
_spaced_secrets: set[str] = set()


def mask_url(url: object) -> str:
    """Return `url` with any password replaced by `***`, safe to print, log or write.

    >>> mask_url("mysql+pymysql://app:s3cret@db:3306/orders")
    'mysql+pymysql://app:***@db:3306/orders'
    >>> mask_url("mysql+pymysql://u:p%40ss w:rd@db/x?charset=utf8&password=x2")
    'mysql+pymysql://u:***@db/x?charset=utf8&password=***'
    """
    text = str(url)
    remember_secrets([text])
    start, at = _userinfo_span(text)
    if at >= 0:
        user, sep, _ = text[start:at].partition(":")
        if sep:
            text = f"{text[:start]}{user}:{MASK}{text[at:]}"
    return _QUERY_IN_URL.sub(_masked_value, text)


def mask_unparsable(url: object) -> str:
    """What may be shown of a URL that could not be parsed: its scheme and user only (without
    its `@host` no one can tell where a password ends), or its length when it is not a URL (a
    piece of one split at a space).

    >>> mask_unparsable("mysql+pymysql://app:s3cret/orders"), mask_unparsable("cret@db/x")
    ('mysql+pymysql://app:***', '<9 characters, not a URL>')
    """
    text = str(url)
    remember_secrets([text])
    match = _SCHEME.match(text.strip())
    if not match:
        return f"<{len(text)} characters, not a URL>"
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
    masked = _USERINFO_IN_TEXT.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", masked)
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
    match = _SCHEME.search(text)
    if match:
        start, at = _userinfo_span(text, match)
        if at >= 0:
            _, sep, password = text[start:at].partition(":")
            if sep and password:
                raw.append(password)
    raw += [m.group(2) for m in _QUERY_IN_URL.finditer(text) if m.group(2)]
    forms: set[str] = set()
    for secret in raw:
        forms.update({secret, unquote(secret), unquote_plus(secret)})
    return forms


def _userinfo_span(text: str, match: re.Match[str] | None = None) -> tuple[int, int]:
    """(start, at) of the userinfo of the URL in `text`: `text[start:at]` is `user:password`
    and `text[at]` the `@` that ends it; at = -1 when there is none.

    The `@` is the last one before the query string, or the last one at all when the password
    itself holds a `?` (never fewer characters than the password)."""
    match = match or _SCHEME.search(text)
    if match is None:
        return 0, -1
    start = match.end()
    if text.startswith("/", start):  # sqlite:///path: no authority at all
        return start, -1
    query = text.find("?", start)
    at = text.rfind("@", start, query) if query >= 0 else -1
    if at < 0:
        at = text.rfind("@", start)
    return start, at


def _masked_value(match: re.Match[str]) -> str:
    return f"{match.group(1)}{MASK}" if match.group(2) else match.group(0)
