"""The proxy's settings for a group against the consumer's configuration (no broker needed)."""

from __future__ import annotations

from consumer_kit.transports.rocketmq5.route import Route
from consumer_kit.transports.rocketmq5.settings import settings_problem

FIFO = {"T": Route("T", frozenset({"FIFO"}), 4)}
NORMAL = {"T": Route("T", frozenset({"NORMAL"}), 4)}
MIXED = {"T": Route("T", frozenset({"NORMAL", "FIFO", "DELAY", "TRANSACTION"}), 4)}


def test_matching_settings_are_no_problem() -> None:
    assert settings_problem("g", FIFO, ordered=True, fifo_group=True) is None
    assert settings_problem("g", NORMAL, ordered=False, fifo_group=False) is None
    assert settings_problem("g", MIXED, ordered=False, fifo_group=False) is None


def test_an_ordered_consumer_of_a_normal_group_is_a_problem() -> None:
    problem = settings_problem("g", FIFO, ordered=True, fifo_group=False)
    assert problem is not None
    assert problem.startswith("consumer group g is not a FIFO group on the cluster")
    assert "scripts/rocketmq5.sh group g 16 fifo" in problem


def test_a_fifo_topic_in_a_normal_group_is_a_problem_even_when_not_listed_as_ordered() -> None:
    problem = settings_problem("g", FIFO, ordered=False, fifo_group=False)
    assert problem is not None
    assert problem.startswith("topic T is a FIFO topic but consumer group g is not a FIFO group")


def test_a_fifo_group_on_a_normal_topic_is_a_problem() -> None:
    problem = settings_problem("g", NORMAL, ordered=False, fifo_group=True)
    assert problem is not None
    assert "is a FIFO group but topic T is NORMAL, not FIFO" in problem
