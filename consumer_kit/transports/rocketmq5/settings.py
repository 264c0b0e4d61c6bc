"""What the proxy's settings say about a consumer group, and whether that is what the consumer
was configured for.

The proxy sends a SimpleConsumer its group's settings (max delivery attempts, FIFO or not) on
start; the 5.1.2 client reads neither, so `simple_consumer` keeps them, and `settings_problem`
compares them with the configuration before any message is received. A mismatch is never
silent: a FIFO topic consumed by a normal group arrives out of order, and a retry limit set
through a name server of another cluster never applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from consumer_kit.transports.rocketmq5 import client
from consumer_kit.transports.rocketmq5.route import Route


def simple_consumer(*args: Any, **kwargs: Any) -> Any:
    """A SimpleConsumer that keeps what the proxy's settings say: the group's max attempts and
    whether it is a FIFO group (the client reads neither)."""
    base = client.v5().SimpleConsumer

    class SettingsKeepingConsumer(base):  # type: ignore[misc,valid-type]
        ckit_max_attempts: int | None = None
        ckit_fifo: bool | None = None

        def reset_setting(self, settings: Any) -> None:
            try:
                if settings.HasField("backoff_policy") and settings.backoff_policy.max_attempts:
                    self.ckit_max_attempts = int(settings.backoff_policy.max_attempts)
                if settings.HasField("subscription"):
                    self.ckit_fifo = bool(settings.subscription.fifo)
            finally:
                super().reset_setting(settings)

    return SettingsKeepingConsumer(*args, **kwargs)


def fifo_only(routes: Mapping[str, Route]) -> list[str]:
    """The topics that take FIFO messages only (a MIXED topic takes others too)."""
    return sorted(t for t, r in routes.items() if r.accepts == frozenset({"FIFO"}))


def settings_problem(group: str, routes: Mapping[str, Route], *, ordered: bool,
                     fifo_group: bool, max_attempts: int | None = None,
                     max_reconsume_times: int | None = None, namesrv: str | None = None,
                     endpoint: str = "") -> str | None:
    """Why a consumer of `group` over `routes` must not start with the proxy's settings
    (`fifo_group`, `max_attempts`), or None when they match the configuration (`ordered`: its
    topics are in `ordered_topics`; `max_reconsume_times` as configured, and written through
    the name server `namesrv`).

    >>> r = {"T": Route("T", frozenset({"FIFO"}), 4)}
    >>> settings_problem("g", r, ordered=True, fifo_group=True) is None
    True
    """
    make_fifo = (f"make it a FIFO group (scripts/rocketmq5.sh group {group} 16 fifo), or give "
                 "the transport namesrv= with create_topics=True or max_reconsume_times")
    if ordered and not fifo_group:
        return (f"consumer group {group} is not a FIFO group on the cluster, but its topics "
                f"({', '.join(sorted(routes))}) are in ordered_topics: RocketMQ 5 would "
                f"deliver them out of order; {make_fifo}")
    plain_group = fifo_only(routes)
    if plain_group and not fifo_group:
        return (f"topic {plain_group[0]} is a FIFO topic but consumer group {group} is not a "
                f"FIFO group: its messages would be consumed out of order; list the topic in "
                f"ordered_topics and {make_fifo}")
    if fifo_group:
        plain = sorted(t for t, r in routes.items() if "FIFO" not in r.accepts)
        if plain:
            return (f"consumer group {group} is a FIFO group but topic {plain[0]} is "
                    f"{'/'.join(sorted(routes[plain[0]].accepts))}, not FIFO: ordered delivery "
                    "needs a FIFO topic (or use a normal group)")
    if max_reconsume_times is not None and max_attempts is not None \
            and max_attempts - 1 != max_reconsume_times:
        return (f"consumer group {group}: max_reconsume_times={max_reconsume_times} was set "
                f"through the name server {namesrv}, but the proxy at {endpoint} allows the "
                f"group {max_attempts - 1} reconsumes: that name server is not the one of the "
                "proxy's cluster (give namesrv= of the cluster behind the proxy)")
    return None
