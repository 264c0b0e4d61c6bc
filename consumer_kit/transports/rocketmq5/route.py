"""One QueryRoute call to the proxy, made directly over gRPC: what message types a topic accepts,
and why a route lookup failed.

The 5.x client reports a proxy that is down, an endpoint that is not a gRPC proxy at all (a name
server, say) and a topic that does not exist with the same bare `Exception("failed to fetch
topic:X route.")`; this call tells them apart so the error is one line that says what to fix.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid

from consumer_kit.core.errors import ConfigError, TransportError, TransportUnavailable

DEFAULT_ROUTE_TIMEOUT = 3.0
_CODE_OK = 20000
_CODE_NOT_FOUND = (40400, 40402)  # NOT_FOUND, TOPIC_NOT_FOUND


@dataclasses.dataclass(frozen=True)
class Route:
    """What the proxy says about a topic."""

    topic: str
    #: message types its queues accept: NORMAL, FIFO, DELAY, TRANSACTION
    accepts: frozenset[str]
    queues: int
    #: the names of the brokers holding its queues (how `cluster` tells clusters apart)
    brokers: frozenset[str] = frozenset()


def _first(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.split(";")[0].rpartition(":")
    return host.strip("[]"), int(port)


def query_route(endpoint: str, topic: str, *, timeout: float = DEFAULT_ROUTE_TIMEOUT) -> Route:
    """Ask the proxy at `endpoint` for the route of `topic`.

    Raises:
        TransportUnavailable: nothing accepts connections at `endpoint`, or no answer in time.
        ConfigError: something answers there but not as a RocketMQ 5 gRPC proxy.
        TransportError: the topic does not exist (or the proxy refused the request).
    """
    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    host, port = _first(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise TransportUnavailable(f"RocketMQ 5 proxy at {endpoint} is unreachable: {exc}") \
            from None
    request = service_pb2.QueryRouteRequest()
    request.topic.name = topic
    request.endpoints.scheme = definition_pb2.AddressScheme.IPv4
    request.endpoints.addresses.add(host=host, port=port)
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            response = MessagingServiceStub(channel).QueryRoute(
                request, timeout=timeout, metadata=_metadata())
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TransportUnavailable(f"RocketMQ 5 proxy at {endpoint} did not answer in "
                                           f"{timeout:g} s") from None
            raise ConfigError(
                f"{endpoint} accepts connections but is not a RocketMQ 5 gRPC proxy ({code}): "
                "point rocketmq5:// at the proxy's gRPC port (8081 by default), not a name "
                "server or broker (those are rocketmq://)") from None
    status = response.status
    if status.code in _CODE_NOT_FOUND:
        raise TransportError(f"topic {topic} does not exist on the RocketMQ 5 cluster behind "
                             f"{endpoint}: create it first (scripts/rocketmq5.sh topic {topic})")
    if status.code != _CODE_OK:
        raise TransportError(f"route of {topic} at {endpoint}: {status.code} {status.message}")
    accepts: set[str] = set()
    brokers: set[str] = set()
    for queue in response.message_queues:
        accepts.update(definition_pb2.MessageType.Name(t) for t in queue.accept_message_types)
        if queue.broker.name:
            brokers.add(queue.broker.name)
    return Route(topic, frozenset(accepts), len(response.message_queues), frozenset(brokers))


def _metadata() -> list[tuple[str, str]]:
    # The proxy refuses a request without a client id.
    return [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-id", f"ckit-route@{socket.gethostname()}@{os.getpid()}"),
            ("x-mq-request-id", uuid.uuid4().hex)]


def route_failure(endpoint: str, topic: str, exc: BaseException, what: str) -> TransportError:
    """The error to raise when the 5.x client failed to fetch a route: what `query_route` finds
    out, else (the route is there now) the client's error as unavailable."""
    try:
        query_route(endpoint, topic)
    except ConfigError as cause:
        return TransportError(f"{what}: {cause}")
    except TransportError as cause:
        kind = type(cause)
        return kind(f"{what}: {cause}")
    return TransportUnavailable(f"{what}: {exc}")
