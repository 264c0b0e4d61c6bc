"""RocketMQAdmin.create_topic returns only once the name server routes the topic: a send right
after it must not meet the C++ client's "No route info of this topic" (seen on a 5.x broker,
which registers a new topic with the name server a moment after answering the create)."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_kit.core.errors import TransportUnavailable
from consumer_kit.transports.rocketmq import admin as admin_mod
from consumer_kit.transports.rocketmq.remoting import PERM_READ, PERM_WRITE, SUCCESS, Response


class LateRouteAdmin(admin_mod.RocketMQAdmin):
    """Two brokers; the name server learns each one's queues only after `late` route lookups."""

    def __init__(self, late: int, perm_seen: int = PERM_READ | PERM_WRITE) -> None:
        super().__init__("127.0.0.1:1")
        self.late = late
        self.perm_seen = perm_seen
        self.lookups = 0

    def master_brokers(self) -> dict[str, str]:
        return {"a": "127.0.0.1:2", "b": "127.0.0.1:3"}

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        self.lookups += 1
        if self.lookups <= self.late:
            # the first broker's registration arrived, the second's not yet
            return {"queueDatas": [{"brokerName": "a", "perm": self.perm_seen}]}
        return {"queueDatas": [{"brokerName": name, "perm": self.perm_seen}
                               for name in ("a", "b")]}


@pytest.fixture
def creates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []

    def fake_call(addr: str, code: int, ext: Any = None, body: bytes = b"", **_: Any) -> Response:
        sent.append(addr)
        return Response(SUCCESS, "", {}, b"")

    monkeypatch.setattr(admin_mod, "call", fake_call)
    return sent


def test_create_topic_waits_until_every_broker_is_routed(creates: list[str]) -> None:
    admin = LateRouteAdmin(late=3)
    admin.create_topic("t", queues=4)
    assert creates == ["127.0.0.1:2", "127.0.0.1:3"]
    assert admin.lookups == 4  # three partial routes, then the whole one


def test_create_topic_names_the_missing_route_instead_of_returning(creates: list[str]) -> None:
    admin = LateRouteAdmin(late=10**9)
    with pytest.raises(TransportUnavailable, match=r"topic t was created on \['a', 'b'\] but "
                                                   r"the name server has no route"):
        admin.create_topic("t", route_wait=0.2)


def test_a_broker_routing_less_permission_than_asked_counts_as_routed(creates: list[str]
                                                                       ) -> None:
    # a read-only broker (brokerPermission=4, being drained) registers perm & 4 for the topic
    admin = LateRouteAdmin(late=0, perm_seen=PERM_READ)
    admin.create_topic("t", perm=PERM_READ | PERM_WRITE, route_wait=0.5)
    assert admin.lookups == 1


def test_no_route_wait_asks_the_name_server_nothing(creates: list[str]) -> None:
    admin = LateRouteAdmin(late=10**9)
    admin.create_topic("%DLQ%g", route_wait=0)  # read_topic: it pulls from the broker itself
    assert creates == ["127.0.0.1:2", "127.0.0.1:3"] and admin.lookups == 0
