"""Redis refusing every write (out of memory under `noeviction`, a read-only replica) is Redis
away, not one key's error: the store degrades once (one warning, `ckit_redis_degraded`) instead of
asking Redis and warning on every message. Runs on a private redis-server of its own (its
settings are changed): skipped without the program, failed under CI."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from consumer_kit import metrics
from consumer_kit.dedupe import Claim, RedisDedupe
from consumer_kit.dedupe.packer import client_options


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_redis() -> Iterator[redis.Redis]:
    """A redis-server of this test's own (never the shared one: its settings change)."""
    program = shutil.which("redis-server")
    if program is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = _free_port()
    server = subprocess.Popen([program, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.5,
                                  socket_connect_timeout=0.5, **client_options())
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def _out_of_memory(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")


def _read_only(client: redis.Redis) -> None:
    client.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica of nobody: read only


@pytest.mark.redis
@pytest.mark.parametrize("refuse", [_out_of_memory, _read_only], ids=["oom", "readonly"])
def test_redis_refusing_every_write_degrades_once_instead_of_warning_per_message(
        private_redis: redis.Redis, refuse: object, caplog: pytest.LogCaptureFixture) -> None:
    # Given a store whose Redis then refuses every write
    store = RedisDedupe(private_redis, "refusing")
    assert store.claim("M0", "me") is Claim.CLAIMED
    assert callable(refuse)
    refuse(private_redis)
    caplog.set_level(logging.WARNING, logger="consumer_kit")
    answers: list[Claim] = []

    def claims(n: int) -> None:
        answers.extend(store.claim(f"M{threading.get_ident()}-{i}", "me") for i in range(n))

    # When consume threads claim, and a pending claim goes out
    threads = [threading.Thread(target=claims, args=(20,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    answers.append(store.claim_later("P1", "me").result())

    # Then every answer is UNAVAILABLE (the processed table decides), the store is degraded
    # with its gauge set, and it said so once
    assert set(answers) == {Claim.UNAVAILABLE}
    assert store.degraded
    assert metrics.DEGRADED.labels("refusing")._value.get() == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    assert "degraded" in warned[0]


@pytest.mark.redis
def test_a_pending_claim_on_a_connection_redis_closed_goes_again_instead_of_degrading(
        private_redis: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    # Given a thread whose kept claim connection Redis then closed (a restart, CLIENT KILL):
    # each consume thread keeps one, so every thread's first claim after it met a dead socket
    # and degraded the store for 5 s again, long after Redis was back
    store = RedisDedupe(private_redis, "closed")
    assert store.claim_later("M1", "me").result() is Claim.CLAIMED
    private_redis.client_kill_filter(_type="normal", skipme=True)
    caplog.set_level(logging.WARNING, logger="consumer_kit")

    # When the thread's next claim goes out
    pend = store.claim_later("M2", "me")
    answer = pend.result()

    # Then it is answered on a new connection: Redis is up, nothing degrades or warns
    assert answer is Claim.CLAIMED
    assert not store.degraded
    assert [r.getMessage() for r in caplog.records] == []
    assert store.claim_later("M2", "other").result() is Claim.BUSY


@pytest.mark.redis
def test_a_lease_released_or_finished_while_degraded_is_still_dropped_once_redis_answers(
        private_redis: redis.Redis) -> None:
    from consumer_kit.dedupe.keys import done_key, lease_key

    # Given leases taken before another thread's failure degraded the store (a blip: Redis is
    # up): a handler then failed (release) and another succeeded (finish) meanwhile
    store = RedisDedupe(private_redis, "blip")
    assert store.claim("FAILED", "me") is Claim.CLAIMED
    assert store.claim("DONE", "me") is Claim.CLAIMED
    store.degrade("claim", redis.ConnectionError("Connection closed by server."))

    # When they give up their leases
    store.release("FAILED", "me")
    store.finish("DONE", "me")
    assert store.flush()

    # Then neither lease is left to answer the redelivery BUSY for the whole lease (2 minutes),
    # and the done marker is written
    assert not private_redis.exists(lease_key("blip", "FAILED"))
    assert not private_redis.exists(lease_key("blip", "DONE"))
    assert private_redis.exists(done_key("blip", "DONE"))
    assert not store.degraded  # the writer's batch proved Redis back


def test_a_long_redis_outage_is_warned_once_not_every_retry_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    import fakeredis

    # Given a store whose Redis stays down across several retry intervals
    store = RedisDedupe(fakeredis.FakeRedis(), "long-outage", retry_after=0.05)
    caplog.set_level(logging.WARNING, logger="consumer_kit")
    down = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    # When each retry after the interval fails again (every 5 s by default: 720 lines an hour)
    for _ in range(4):
        store.failed("claim", "M1", down)
        time.sleep(0.06)
    store.failed("claim", "M1", down)

    # Then the outage is one warning, and its end one more
    assert len([r for r in caplog.records if "degraded" in r.getMessage()]) == 1
    store.ok(store.failures)
    assert [r.getMessage() for r in caplog.records][-1].startswith("redis is back")
    store.failed("claim", "M2", down)  # a new outage is warned again
    assert len([r for r in caplog.records if "degraded" in r.getMessage()]) == 2


def test_a_wrongtype_error_is_the_keys_own_also_as_older_redis_wraps_it() -> None:
    from consumer_kit.dedupe.claims import key_error

    # Redis 7 answers a script's WRONGTYPE as is; Redis 6 wraps it in the script's error
    assert key_error(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong "
                                         "kind of value"))
    assert key_error(redis.ResponseError(
        "ERR Error running script (call to f_0123): @user_script:24: WRONGTYPE Operation "
        "against a key holding the wrong kind of value"))
    # while out of memory, read-only or refused by an ACL is Redis away for every key
    for text in ("OOM command not allowed when used memory > 'maxmemory'.",
                 "ERR Error running script (call to f_0123): @user_script:24: "
                 "@user_script: 24: -OOM command not allowed when used memory > 'maxmemory'.",
                 "READONLY You can't write against a read only replica.",
                 "NOPERM this user has no permissions to run the 'evalsha' command"):
        assert not key_error(redis.ResponseError(text))
