"""URL helpers: passwords never leave this module unmasked."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]*)@")


def mask_url(url: str) -> str:
    """Return `url` with any password replaced by `***`, safe to print or log.

    >>> mask_url("mysql+pymysql://app:s3cret@db:3306/orders")
    'mysql+pymysql://app:***@db:3306/orders'
    """
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", str(url))


def mask_text(text: str) -> str:
    """Mask every URL password found anywhere in `text` (error messages, driver output)."""
    return mask_url(text)
