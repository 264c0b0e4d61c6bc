"""Whether the name server given to a `rocketmq5://` transport is the one of the proxy's cluster,
judged before a consumer's group (its retry limit, FIFO flag, dead-letter topic) is written
through it: the proxy names the brokers that hold a topic's queues, and so does a name server.
With `create_topics`, a topic that name server has no route for is created through it first
(asking the proxy about a topic before it exists makes the proxy remember it as missing).

A topic the proxy routes but the name server does not know, or routes to none of the same
brokers, proves another cluster. Two clusters whose brokers share names (both `broker-a`, the
default) cannot be told apart this way: the consumer's start still compares the retry limit the
proxy reports with the one written (`settings.settings_problem`).
"""

from __future__ import annotations

from typing import Any

from consumer_kit.transports.rocketmq5.route import Route


def name_server_problem(namesrv_route: dict[str, Any] | None, route: Route, *, namesrv: str,
                        endpoint: str) -> str | None:
    """Why `namesrv` (whose route of `route.topic` is `namesrv_route`, None when it has none)
    is not the name server of the cluster behind the proxy at `endpoint`, else None.

    >>> r = Route("T", frozenset({"NORMAL"}), 4, frozenset({"broker5-a"}))
    >>> name_server_problem({"brokerDatas": [{"brokerName": "broker5-a"}]}, r, namesrv="n",
    ...                     endpoint="p") is None
    True
    """
    if not route.brokers:  # the proxy named no broker: nothing to compare
        return None
    fix = ("namesrv= must be the name server of the cluster behind the proxy (the consumer's "
           "group was not written through it)")
    if namesrv_route is None:
        return (f"topic {route.topic} is on the cluster behind the RocketMQ 5 proxy at "
                f"{endpoint} (brokers {', '.join(sorted(route.brokers))}), but the name server "
                f"{namesrv} has no route for it: {fix}")
    names = {str(b.get("brokerName")) for b in namesrv_route.get("brokerDatas") or []}
    if names.isdisjoint(route.brokers):
        return (f"topic {route.topic} is on brokers {', '.join(sorted(route.brokers))} behind "
                f"the RocketMQ 5 proxy at {endpoint}, but on "
                f"{', '.join(sorted(names)) or 'no broker'} by the name server {namesrv}: {fix}")
    return None
