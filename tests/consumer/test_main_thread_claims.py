"""Redis claims made on the main thread, the one thread a signal handler can interrupt: it never
joins the consume threads' combined sends, an interrupted claim leaves no answer behind for
the thread's next one, and no number reaches hiredis's packer (where a handler raising is a
crash): not from our script calls, not from redis-py's connect handshake on the app's clients."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import fakeredis
import hiredis
import pytest
import redis
from redis.connection import (  # type: ignore[attr-defined]
    HiredisRespSerializer,
    PythonRespSerializer,
)

from consumer_kit.dedupe import Claim, RedisDedupe, scripts
from consumer_kit.dedupe.packer import TextNumbersPacker, client_options
from consumer_kit.dedupe.scripts import release_kept, thread_connection
from tests.consumer.conftest import Env

DEADLINE = 10.0


class Interrupt(BaseException):
    """What a signal handler raises (KeyboardInterrupt, SystemExit, the app's own)."""


def record_hiredis(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every command hiredis packs from now on (redis-py's packer and the lone claim's)."""
    packed: list[tuple[Any, ...]] = []
    real_pack = hiredis.pack_command

    def recording(command: tuple[Any, ...]) -> bytes:
        packed.append(command)
        return real_pack(command)

    monkeypatch.setattr(hiredis, "pack_command", recording)
    monkeypatch.setattr(scripts, "_pack", recording)
    return packed


def database_1(env: Env) -> str:
    """The URL of database 1 of the test's Redis."""
    kwargs = env.redis.connection_pool.connection_kwargs
    return f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}/1"


def test_a_claim_on_the_main_thread_never_waits_behind_another_threads_send(env: Env) -> None:
    # Given: a consume thread's claim held inside the combiner's send (a slow round trip)
    store = RedisDedupe(env.redis, env.group("g"))
    real_send = store._claims.send
    inside, gate = threading.Event(), threading.Event()

    def held(items: Sequence[tuple[str, str]]) -> Sequence[int | Exception]:
        inside.set()
        gate.wait(DEADLINE)
        return real_send(items)

    store._claims.send = held
    worker_answer: list[Claim] = []
    worker = threading.Thread(target=lambda: worker_answer.append(store.claim("M1", "worker")),
                              daemon=True)
    worker.start()
    assert inside.wait(DEADLINE)

    # When: the main thread claims meanwhile (the held send is let go after 2 s, should the
    # main thread be waiting for it)
    opener = threading.Timer(2.0, gate.set)
    opener.start()
    try:
        answer = store.claim("M2", "main")
        waited = gate.is_set()
    finally:
        gate.set()
        opener.cancel()
        worker.join(DEADLINE)

    # Then: it was answered at once, on its own; the held claim still got its answer
    assert answer is Claim.CLAIMED
    assert not waited, "the main thread's claim waited for the consume thread's send"
    assert worker_answer == [Claim.CLAIMED]
    assert store._claims.items == 1  # only the consume thread's claim went through it


def test_a_claim_interrupted_between_its_send_and_its_read_leaves_no_answer_for_the_next(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: the thread's claim connection is open, and a signal handler will raise once
    # right before the next claim's answer is read (its answer then sits on the wire)
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    conn = thread_connection(env.redis.connection_pool)
    real_read = conn.read_response
    interrupted: list[bool] = []

    def read_once_interrupted(*args: Any, **kwargs: Any) -> Any:
        if not interrupted:
            interrupted.append(True)
            raise Interrupt
        return real_read(*args, **kwargs)

    monkeypatch.setattr(conn, "read_response", read_once_interrupted)
    with pytest.raises(Interrupt):
        store.claim("M2", "me")

    # When: the thread claims again
    answer = store.claim("M1", "other")

    # Then: it gets its own answer (M1 is leased by "me"), not the CLAIMED left for M2
    assert interrupted == [True]
    assert answer is Claim.BUSY
    assert store.claim("M2", "me") is Claim.CLAIMED  # and M2 can still be claimed


def test_a_claim_whose_clean_up_is_interrupted_too_leaves_no_answer_for_the_next(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: the next claim is interrupted right before its read, and again at the start of
    # the clean-up that drops its connection (its answer then stays on the wire)
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    conn = thread_connection(env.redis.connection_pool)
    real_read, real_disconnect = conn.read_response, conn.disconnect
    interrupted: list[str] = []

    def read(*args: Any, **kwargs: Any) -> Any:
        if "read" not in interrupted:
            interrupted.append("read")
            raise Interrupt
        return real_read(*args, **kwargs)

    def disconnect(*args: Any, **kwargs: Any) -> Any:
        if "disconnect" not in interrupted:
            interrupted.append("disconnect")
            raise Interrupt
        return real_disconnect(*args, **kwargs)

    monkeypatch.setattr(conn, "read_response", read)
    monkeypatch.setattr(conn, "disconnect", disconnect)
    with pytest.raises(Interrupt):
        store.claim("M2", "me")

    # When / Then: the thread's next claims get their own answers
    assert interrupted == ["read", "disconnect"]
    assert store.claim("M1", "other") is Claim.BUSY
    assert store.claim("M2", "other") in (Claim.BUSY, Claim.CLAIMED)  # M2 may not have run
    assert store.claim("M3", "me") is Claim.CLAIMED


@pytest.mark.skipif(not redis.utils.HIREDIS_AVAILABLE, reason="needs hiredis")
def test_an_interrupted_connect_handshake_leaves_no_connection_on_the_wrong_database(
        real_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: the app's client on database 1, where another token holds M1's lease
    app = real_env.app()
    app.redis_config = database_1(real_env)
    client = app._redis_client()
    assert client is not None
    try:
        group = real_env.group("g")
        assert RedisDedupe(client, group).claim("M1", "other") is Claim.CLAIMED
        pool = client.connection_pool
        pool.disconnect()
        # and a signal handler that raises once while this client's next handshake packs its
        # SELECT
        packer = pool.connection_kwargs["command_packer"]
        real_pack = TextNumbersPacker.pack
        interrupted: list[bool] = []

        def pack(self: Any, *args: Any) -> Any:
            if self is packer and not interrupted and args[0] == "SELECT":
                interrupted.append(True)
                raise Interrupt
            return real_pack(self, *args)

        monkeypatch.setattr(TextNumbersPacker, "pack", pack)
        with pytest.raises(Interrupt):
            client.ping()
        assert interrupted == [True]
        handed_back = pool._available_connections[-1]  # the next one the pool hands out

        # When: a consume thread claims afterwards (its connection comes from the pool)
        took: list[bool] = []
        answers: list[Claim] = []

        def consume() -> None:
            took.append(thread_connection(pool) is handed_back)
            answers.append(RedisDedupe(client, group).claim("M1", "me"))

        worker = threading.Thread(target=consume)
        worker.start()
        worker.join(DEADLINE)
    finally:
        client.close()

    # Then: it got the interrupted handshake's connection, and its claim ran on database 1
    # (the lease is another's), not on database 0
    assert took == [True]
    assert answers == [Claim.BUSY]


@pytest.mark.skipif(not redis.utils.HIREDIS_AVAILABLE, reason="needs hiredis")
def test_every_script_call_reaches_hiredis_with_its_numbers_as_text(
        real_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # hiredis 3.5.0 formats an int argument by a call that can run a Python signal handler and
    # does not check its result: a handler raising there (Ctrl-C on the main thread) is a
    # segmentation fault. So no number of ours may reach its packer.
    packed = record_hiredis(monkeypatch)
    store = RedisDedupe(real_env.redis, real_env.group("g"))

    # When: every script runs, on each path (the lone claim, a pending claim carrying done
    # markers, the background writer's pipeline, renew and release)
    assert store.claim("M1", "me") is Claim.CLAIMED
    store.finish("M1", "me")
    assert store.claim_later("M2", "me").result() is Claim.CLAIMED
    assert store.renew("M2", "me")
    store.release("M2", "me")
    store.finish("M3", "me")
    assert store.flush()

    # Then: every EVALSHA packed had only text arguments, and every path was seen
    ours = [c for c in packed if c[0] in ("EVALSHA", b"EVALSHA")]
    numbers = [c for c in ours if any(not isinstance(a, str | bytes) for a in c)]
    assert numbers == []
    scripts_run = {c[1] for c in ours}
    assert scripts_run == {s.sha for s in (store._claim, store._finish, store._renew,
                                           store._release)}


@pytest.mark.skipif(not redis.utils.HIREDIS_AVAILABLE, reason="needs hiredis")
def test_the_apps_own_redis_client_connects_without_handing_hiredis_a_number(
        real_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # redis-py's connect handshake sends `SELECT <db>` (and `HELLO 3` with RESP3) with ints:
    # a handler raising while hiredis formats one (a second Ctrl-C during a reconnect) would
    # be a crash. Database 1 and RESP3, so both are sent.
    packed = record_hiredis(monkeypatch)
    app = real_env.app()
    app.redis_config = database_1(real_env) + "?protocol=3"
    client = app._redis_client()
    assert client is not None
    try:
        assert client.ping()
    finally:
        client.close()
    names = {(c[0].decode() if isinstance(c[0], bytes) else str(c[0])).upper() for c in packed}
    assert {"SELECT", "HELLO", "PING"} <= names
    assert [c for c in packed if any(type(a) in (int, float) for a in c)] == []


@pytest.mark.skipif(not redis.utils.HIREDIS_AVAILABLE, reason="needs hiredis")
def test_the_text_numbers_packer_packs_the_same_bytes_as_redis_pys_hiredis_packer() -> None:
    ours, theirs = TextNumbersPacker(), HiredisRespSerializer()
    for command in [("SELECT", 1), ("HELLO", 3), ("SET", "k", "v", "PX", 120000),
                    ("EVALSHA", "a" * 40, "2", "k1", "k2", "t", "120000"),
                    ("INCRBYFLOAT", "k", 0.1), ("SET", b"\xff", "ü", "EX", -1),
                    ("CLIENT SETINFO", "LIB-NAME", "x")]:
        assert ours.pack(*command) == theirs.pack(*command)


@pytest.mark.parametrize("setup", ["default", "client_options", "latin-1", "python-packer"])
def test_a_pending_claim_and_its_riders_pack_the_bytes_redis_py_packs(setup: str) -> None:
    options: dict[str, Any] = {
        "default": {}, "client_options": client_options(), "latin-1": {"encoding": "latin-1"},
        "python-packer": {"command_packer": PythonRespSerializer(6000, lambda v: (
            v.encode() if isinstance(v, str) else v))}}[setup]
    client = redis.Redis.from_url("redis://127.0.0.1:1/0", **options)  # packs, never connects
    conn = client.connection_pool.make_connection()
    claim, finish = scripts.LuaScript(client, "claim.lua"), scripts.LuaScript(client, "finish.lua")
    calls: list[scripts.Call] = [
        (finish, ["ckit:done:g:01A", "ckit:lease:g:01A"], ["tok-1", "604800000"]),
        (finish, ["ckit:done:g:ünïcode", "ckit:lease:g:ünïcode"], ["tök", "1"]),
        (finish, ["ckit:done:g:" + "x" * 7000, "ckit:lease:g:big"], ["t", "2"]),  # > the cutoff
        (claim, ["ckit:done:g:01B", "ckit:lease:g:01B"], ["tok-2", "30000"]),
    ]
    # what redis-py's pure-Python packer sends for UTF-8 text: RESP, argument by argument
    reference = PythonRespSerializer(6000, lambda v: v.encode() if isinstance(v, str) else v)
    for some in (calls[-1:], calls):
        packed = b"".join(scripts.pack_calls(conn, some))
        assert packed == b"".join(
            conn.pack_commands([scripts.evalsha(call) for call in some]))
        assert packed == b"".join(
            b"".join(reference.pack(*scripts.evalsha(call))) for call in some)
    client.close()


def test_a_kept_connection_given_back_with_an_answer_unread_is_dropped_first() -> None:
    # A RESP3 pool does not look for unread data when it hands a connection out again
    pool = fakeredis.FakeRedis().connection_pool
    clean, unread = thread_connection(pool, "clean"), thread_connection(pool, "unread")
    clean.ckit_unread, unread.ckit_unread = False, True
    dropped: list[Any] = []
    for conn in (clean, unread):
        conn.disconnect = lambda *a, conn=conn, **k: dropped.append(conn)
    assert release_kept(pool) == 2
    assert dropped == [unread]
