"""bench/redis_claim_cost.py on the real Redis: it prints every variant's costs and leaves no key
of its own on the shared server (it never flushes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import redis

from consumer_kit.dedupe.keys import PREFIX
from tests import services

BENCH = Path(__file__).resolve().parents[2] / "bench" / "redis_claim_cost.py"

pytestmark = pytest.mark.redis


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("redis_claim_cost", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _bench_keys(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match=f"{PREFIX}:{{bench-claimcost-*", count=1000))


def test_the_claim_cost_bench_prints_each_call_and_deletes_every_key_it_made(
        capsys: pytest.CaptureFixture[str]) -> None:
    services.require("redis", services.ping_redis)
    client = redis.Redis.from_url(services.redis_url())
    try:
        before = set(_bench_keys(client))  # another run's, on a shared server: not ours
        _bench().main(["--redis-url", services.redis_url(), "--calls", "30", "--runs", "2"])
        out = capsys.readouterr().out
        rows = {line.strip().split("  ")[0]: line for line in out.splitlines()
                if line.strip().startswith(("PING", "SET NX", "claim", "what-if"))}
        assert set(rows) == {"PING", "SET NX PX", "claim alone (EVALSHA)",
                             "claim + done marker (per message, default)",
                             "what-if: the same as 3 plain commands"}, out
        assert rows["PING"].rstrip().endswith("1.00x"), out
        assert "redis   : " in out and "command : " in out, out
        assert set(_bench_keys(client)) <= before
    finally:
        client.close()


def test_the_claim_cost_bench_refuses_a_redis_that_does_not_answer_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _bench().main(["--redis-url", "redis://:secret-pw@127.0.0.1:1/0", "--calls", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and "did not answer" in err, err
    assert "secret-pw" not in err
