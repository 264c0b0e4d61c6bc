"""A database server that refuses the SQL transport's login (a wrong password, user or database)
fails it at once with one line: waiting cannot fix a misconfiguration (PostgreSQL's refusal used
to be retried for `unavailable_after`, 30 s, as if the server were down)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.transports.sql import SqlTransport
from tests.harnesses.sql_mariadb import mariadb_url
from tests.harnesses.sql_postgresql import postgresql_url

SERVERS = [pytest.param(mariadb_url, id="mariadb", marks=pytest.mark.mariadb),
           pytest.param(postgresql_url, id="postgresql", marks=pytest.mark.postgresql)]


def refused(url: str, change: dict[str, str]) -> str:
    return sa.make_url(url).set(**change).render_as_string(  # type: ignore[arg-type]
        hide_password=False)


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("change", [{"password": "not-the-s3cret"}, {"username": "nobody"},
                                    {"database": "no_such_database"}],
                         ids=["password", "user", "database"])
def test_a_refused_login_fails_at_once_not_as_an_outage(server: Callable[[], str],
                                                        change: dict[str, str]) -> None:
    # Given the transport pointed at a running server with a wrong password, user or database
    url = refused(server(), change)
    with SqlTransport(url, unavailable_after=20) as t:
        started = time.monotonic()
        # When it sends, then it fails with the server's reason, well before unavailable_after
        with pytest.raises(TransportError) as caught:
            t.send(OutgoingMessage("orders", b"x"))
    assert time.monotonic() - started < 5
    assert not isinstance(caught.value, TransportUnavailable)
    assert "not-the-s3cret" not in str(caught.value) and "failed to" in str(caught.value)
