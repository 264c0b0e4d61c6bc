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


def test_a_retry_limit_the_proxy_does_not_report_is_a_problem_naming_both() -> None:
    # Given max_reconsume_times=1 written through a name server, the proxy reporting 17 attempts
    problem = settings_problem("g", NORMAL, ordered=False, fifo_group=False, max_attempts=17,
                               max_reconsume_times=1, namesrv="127.0.0.1:9876",
                               endpoint="127.0.0.1:8081")
    # Then
    assert problem is not None
    assert "max_reconsume_times=1 was set through the name server 127.0.0.1:9876" in problem
    assert "the proxy at 127.0.0.1:8081 allows the group 16 reconsumes" in problem


def test_the_retry_limit_the_proxy_reports_is_no_problem_when_it_is_the_configured_one() -> None:
    assert settings_problem("g", NORMAL, ordered=False, fifo_group=False, max_attempts=2,
                            max_reconsume_times=1, namesrv="n:1", endpoint="p:1") is None
    assert settings_problem("g", NORMAL, ordered=False, fifo_group=False, max_attempts=17,
                            max_reconsume_times=None, namesrv="n:1", endpoint="p:1") is None
