"""The native RocketMQ client is given name-server addresses, never host names: librocketmq
resolves a name on its own threads, and one that does not resolve aborts the process
(`consumer_kit.transports.rocketmq.resolve`)."""

from __future__ import annotations

import socket

import pytest

from consumer_kit.core.errors import ConfigError, TransportUnavailable
from consumer_kit.transports.rocketmq.resolve import for_native, resolved


def test_addresses_are_kept_and_host_names_become_addresses() -> None:
    assert resolved("127.0.0.1:9876;10.0.0.7:9877") == "127.0.0.1:9876;10.0.0.7:9877"
    assert resolved("localhost:9876;127.0.0.1:9877") == "127.0.0.1:9876;127.0.0.1:9877"
    assert resolved("[::1]:9876;127.0.0.1:9877") == "[::1]:9876;127.0.0.1:9877"


def test_a_name_that_does_not_exist_is_a_config_error_at_check_and_an_outage_at_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a misspelt host, which the resolver says does not exist (whatever this machine's
    # DNS would answer)
    real = socket.getaddrinfo

    def no_such_name(host: str, *args: object, **kwargs: object) -> object:
        if host == "nohost.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    addr = "127.0.0.1:9876;nohost.invalid:9876"
    # When / Then: checked, it is named as a mistake; at a native client's start, an outage
    with pytest.raises(ConfigError, match=r"'nohost\.invalid' does not resolve"):
        resolved(addr)
    with pytest.raises(TransportUnavailable, match=r"'nohost\.invalid' does not resolve"):
        for_native(addr)


def test_a_resolver_that_does_not_answer_is_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a resolver that fails for now
    def away(*_args: object, **_kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", away)
    # When / Then: not a mistake in the URL, so never a ConfigError
    with pytest.raises(TransportUnavailable, match="could not be resolved now"):
        resolved("namesrv.example:9876")
