"""Is a RocketMQ push consumer still pulling? The backlog of the queues it owns says so.

After a broker restart the 2.0.0 native client can drop its pull requests while its process
stays up: no error, no message, the group's backlog grows. Nothing inside the client shows it,
so the watchdog asks the broker: a consumer that had no message for `stall_after` seconds
while queues allocated to it hold messages it has not consumed has stalled.

Which queues are this consumer's is computed the way the C++ client allocates them
(AllocateMessageQueueAveragely over the sorted queues of each topic and the sorted client ids
the broker lists for the group), so a quiet consumer whose group peers own the backlog is not
taken for a stalled one. A consumer the broker does not list at all (its heartbeats lost) while
the topic has a backlog is stalled too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter

from consumer_kit.transports.rocketmq.admin import RocketMQAdmin

T = TypeVar("T")

#: Seconds without a message, while owned queues hold a backlog, after which a consumer has
#: stalled (RocketMQTransport(stall_after=...); 0 turns the watchdog off).
DEFAULT_STALL_AFTER = 60.0
#: How often the C++ client commits consumed offsets to the broker (its fixed
#: persistConsumerOffsetInterval): until then the last messages still count as a backlog.
OFFSET_COMMIT_SECONDS = 5.0
#: The least `stall_after` (besides 0, off): below twice the commit interval an idle, healthy
#: consumer whose last offsets are not committed yet would be taken for a stalled one
#: (idleness counts from the last callback's return, after which the commit may take 5 s).
MIN_STALL_AFTER = 2 * OFFSET_COMMIT_SECONDS
#: Rebuilds of one consumer before the process gives up (exits non-zero for its supervisor).
DEFAULT_MAX_REBUILDS = 2

STALLS = Counter("ckit_consumer_stalls", "RocketMQ consumers found stalled (no message while "
                 "their queues hold a backlog), by what was done: rebuild or exit",
                 ["group", "action"])


def allocate_averagely(queues: Sequence[T], client_ids: Sequence[str], client_id: str) -> list[T]:
    """The queues `client_id` gets among `client_ids` (RocketMQ's AllocateMessageQueueAveragely;
    both lists already sorted); none when it is not among them."""
    if client_id not in client_ids or not queues:
        return []
    index = client_ids.index(client_id)
    n_queues, n_clients = len(queues), len(client_ids)
    mod = n_queues % n_clients
    if n_queues <= n_clients:
        size = 1
    elif mod > 0 and index < mod:
        size = n_queues // n_clients + 1
    else:
        size = n_queues // n_clients
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n_queues] for i in range(min(size, n_queues - start))]


@dataclass(frozen=True)
class Backlog:
    """What the broker holds for one consumer of a group."""

    #: messages not yet consumed in the queues allocated to this consumer
    owned: int
    #: messages not yet consumed in all queues of the group's topics
    total: int
    #: whether the broker lists this consumer among the group's clients
    registered: bool

    @property
    def stalled_if_idle(self) -> bool:
        """True when an idle consumer with this backlog has stalled."""
        return self.owned > 0 or (not self.registered and self.total > 0)


def owned_backlog(admin: RocketMQAdmin, group: str, topics: Sequence[str],
                  instance_name: str) -> Backlog:
    """The group's unconsumed messages in `topics`, and the part allocated to the consumer whose
    client id ends with `@instance_name`.

    Raises:
        TransportUnavailable: the name server or a broker did not answer.
    """
    owned = total = 0
    registered = False
    for topic in topics:
        queues = sorted((broker, queue_id, addr)
                        for broker, addr, queue_id, _perm in admin.topic_queues(topic))
        if not queues:
            continue
        lags = {(b, q): admin.queue_lag(addr, topic, q, group=group) for b, q, addr in queues}
        total += sum(lags.values())
        client_ids = sorted(admin.consumer_ids(queues[0][2], group))
        mine = [c for c in client_ids if c.split("@", 1)[-1] == instance_name]
        if not mine:
            continue
        registered = True
        for broker, queue_id, _addr in allocate_averagely(queues, client_ids, mine[0]):
            owned += lags[(broker, queue_id)]
    return Backlog(owned=owned, total=total, registered=registered)
