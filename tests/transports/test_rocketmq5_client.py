"""The 5.x client as `consumer_kit.transports.rocketmq5.client` loads it: its gRPC channels retry a
lost proxy every second at most (gRPC's own back-off grows to 120 s)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from unittest import mock

import pytest

from consumer_kit.transports.rocketmq5 import client


class RecordingAio:
    """Stands in for `grpc.aio`: records the channels asked for."""

    def __init__(self) -> None:
        self.channels: list[tuple[str, str, list[tuple[str, Any]]]] = []
        self.ChannelConnectivity = "the real module's attribute"

    def insecure_channel(self, target: str, options: Any = None) -> Any:
        self.channels.append(("insecure", target, list(options)))
        return mock.MagicMock(name="channel")

    def secure_channel(self, target: str, credentials: Any, options: Any = None) -> Any:
        self.channels.append(("secure", target, list(options)))
        return mock.MagicMock(name="channel")


def test_loading_the_client_caps_the_reconnect_backoff_of_its_channel_module() -> None:
    client.v5()
    from rocketmq.v5.client.connection import rpc_channel

    assert isinstance(rpc_channel.aio, client.BackoffCappedAio)
    client._cap_reconnect_backoff()  # again: never wrapped twice
    assert not isinstance(rpc_channel.aio.aio, client.BackoffCappedAio)


def test_the_channels_the_client_builds_itself_carry_the_capped_backoff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client.v5()
    from rocketmq.grpc_protocol import definition_pb2
    from rocketmq.v5.client.connection import rpc_channel

    aio = RecordingAio()
    monkeypatch.setattr(rpc_channel.aio, "aio", aio)  # under the installed cap
    endpoints = definition_pb2.Endpoints(
        scheme=definition_pb2.AddressScheme.IPv4,
        addresses=[definition_pb2.Address(host="127.0.0.1", port=8081)])
    loop = asyncio.new_event_loop()
    try:
        rpc_channel.RpcChannel(rpc_channel.RpcEndpoints(endpoints)).create_channel(loop)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    (kind, target, options), = aio.channels
    assert (kind, target) == ("insecure", "ipv4:127.0.0.1:8081")
    assert ("grpc.enable_retries", 0) in options  # the client's own options stay
    assert dict(options)["grpc.max_reconnect_backoff_ms"] == 1000
    assert dict(options)["grpc.initial_reconnect_backoff_ms"] == 500


def test_channels_keep_the_clients_options_and_get_the_capped_backoff() -> None:
    aio = RecordingAio()
    capped = client.BackoffCappedAio(aio)
    own = [("grpc.enable_retries", 0), ("grpc.max_reconnect_backoff_ms", 120_000)]
    capped.insecure_channel("127.0.0.1:8081", own)
    capped.secure_channel("127.0.0.1:8081", "credentials", own)
    for _, target, options in aio.channels:
        assert target == "127.0.0.1:8081"
        assert dict(options) == {"grpc.enable_retries": 0,
                                 "grpc.initial_reconnect_backoff_ms": 500,
                                 "grpc.max_reconnect_backoff_ms": 1000}
    assert capped.ChannelConnectivity == "the real module's attribute"  # the rest is grpc.aio


def test_a_channel_without_options_gets_the_capped_backoff() -> None:
    aio = RecordingAio()
    client.BackoffCappedAio(aio).insecure_channel("127.0.0.1:8081")
    assert aio.channels[0][2] == list(client.RECONNECT_OPTIONS)


async def _connection_attempts(aio: Any, seconds: float) -> int:
    """Connections a gRPC channel of `aio` opens in `seconds` to a server that hangs up on each
    (a proxy still restarting), while RPCs keep being tried as the client's loops do."""
    import grpc

    accepted = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute")
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    try:
        while loop.time() < end:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call(b"", timeout=0.2)
            await asyncio.sleep(0.1)
    finally:
        await channel.close()
        server.close()
        await server.wait_closed()
    return accepted


def test_a_capped_channel_retries_a_failing_server_every_second_where_grpc_backs_off() -> None:
    import grpc.aio

    async def both() -> tuple[int, int]:
        capped, default = await asyncio.gather(
            _connection_attempts(client.BackoffCappedAio(grpc.aio), 12.0),
            _connection_attempts(grpc.aio, 12.0))
        return capped, default

    capped, default = asyncio.run(both())
    # gRPC's default: attempts at about 0, 1, 2.6, 5.2 and 9.3 s (x1.6, 20% jitter)
    assert default <= 7, f"gRPC's default back-off made {default} attempts in 12 s"
    # capped: 0.5 s, then at most 1 s between attempts
    assert capped >= 9, f"the capped channel made only {capped} attempts in 12 s"
