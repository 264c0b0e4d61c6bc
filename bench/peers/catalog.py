"""The peers: what each is, the exact versions installed, where it runs, and how its semantics
differ from consumer-kit's (printed under "unfairness in this comparison")."""

from __future__ import annotations

from dataclasses import dataclass, field

MYSQL = "mysql"
POSTGRESQL = "postgresql"


@dataclass(frozen=True)
class Peer:
    """One contestant. `requirements` empty means the project's own environment."""

    name: str
    runner: str  # module under bench.peers.runners
    databases: tuple[str, ...]
    requirements: tuple[str, ...] = ()
    #: publish jobs: label -> extra job fields (one row each in the publish table)
    publish: dict[str, dict[str, str]] = field(default_factory=dict)
    drain: dict[str, list[dict[str, object]]] = field(default_factory=dict)  # db -> settings
    #: backlog each drain setting is first tried on (small for relays doing a commit per row)
    sweep_rows: int = 10_000
    dedupe: bool = False
    notes: tuple[str, ...] = ()
    why_not_everywhere: str = ""


_DJANGO = ("Django==5.2.19", "PyMySQL==1.2.4", "psycopg[binary]==3.3.9")

CKIT = Peer(
    name="consumer-kit",
    runner="ckit",
    databases=(MYSQL, POSTGRESQL),
    publish={"consumer-kit (Connection)": {"api": "connection"},
             "consumer-kit (Session + Dispatcher)": {"api": "session"}},
    drain={db: [{"batch": b, "workers": w, "claim": c}
                for c in ("lease", "lock")
                for b, w in ((200, 1), (500, 1), (1000, 1), (500, 2), (1000, 2))]
           for db in (MYSQL, POSTGRESQL)},
    dedupe=True,
    notes=(
        "publish checks every field's length and the payload type, writes 17 columns, makes a "
        "ULID and is idempotent on (biz_type, biz_key) (on PostgreSQL by ON CONFLICT DO "
        "NOTHING, so a duplicate key leaves the caller's transaction usable); its INSERT is "
        "compiled once and run on the driver's cursor (SQLAlchemy's execution context skipped, "
        "as no event listener or echo is set here; on PostgreSQL, once psycopg's cursor has "
        "prepared it, its EXECUTE goes below the cursor under psycopg's own statement: "
        "consumer_kit/core/pg_prepared.py); the floor's goes through exec_driver_sql: "
        "bench/publish_floor.py also prints the driver alone, without SQLAlchemy, and what the "
        "path below the cursor saves.",
        "the Session row pays the after-commit hook and a dispatcher thread that claims, sends "
        "and marks the row SENT while the next transactions run (same process, same GIL); the "
        "figure is the commit latency the caller sees, not the send. That thread also slows the "
        "bare and floor transactions interleaved with it, so its x bare understates its cost.",
        "the relay sends to a no-op transport, as the peers send to no-op functions; the sweep "
        "tries both claim modes: `lease` (SKIP LOCKED claim to SENDING under a lease, then a "
        "guarded UPDATE to SENT: two writes per row, sends outside any transaction) and `lock` "
        "(the batch held with FOR UPDATE SKIP LOCKED while it is sent, one UPDATE to SENT in "
        "that transaction, the lease enforced as the server's idle-transaction timeout); the "
        "best is timed. It refreshes backlog gauges at start and end.",
        "dedupe: the processed row is inserted in the handler's own transaction (exactly once in "
        "effect), on the driver's cursor as publish's row (the floor's goes through the "
        "Session); on PostgreSQL, the transaction's first statement, it goes with psycopg's "
        "BEGIN in one round trip as a prepared statement (consumer_kit/core/pg_libpq.py): the "
        "decorated transaction makes as many round trips as the bare one, the floor one more; "
        "on MariaDB it goes back to the pool without the pool's reset ROLLBACK after its own "
        "COMMIT (consumer_kit/core/checkin.py), which the bare and floor Sessions pay "
        "(SQLAlchemy's default; PyMySQL sends it even with nothing open; psycopg does not): "
        "there too the decorated transaction makes as many round trips as the bare one "
        "(pre-ping, INSERT, COMMIT, ROLLBACK against pre-ping, two INSERTs, COMMIT), and a "
        "duplicate one ROLLBACK fewer, so database-only duplicates are rejected faster; "
        "with Redis, one claim round trip per message (sent before that INSERT, read after "
        "it), whose script also sets the previous message's done marker; the 'adaptive' mode "
        "(redis_claims=\"adaptive\") sends no claim while duplicates are rare (the processed "
        "row decides; done markers go to Redis in batches) and claims again after about five "
        "in a row. Duplicates measured are ids this process did not see (in-process cache off).",
    ),
)

TXOUTBOX = Peer(
    name="txoutbox",
    runner="txoutbox",
    databases=(POSTGRESQL,),
    requirements=("txoutbox==0.2.2", "asyncpg==0.32.0"),
    publish={"txoutbox": {}},
    drain={POSTGRESQL: [{"batch": b, "concurrency": c, "strict": s}
                        for b, c, s in ((50, 10, True), (200, 10, True), (1000, 10, True),
                                        (1000, 100, True), (1000, 100, False))]},
    notes=(
        "asyncio + asyncpg (prepared statements, binary protocol) against consumer-kit's "
        "sync SQLAlchemy + psycopg: the bare transaction is a different one, compare the added ms.",
        "publish writes 4 columns (topic, key, payload, headers) with no id of its own, no "
        "idempotency key, no length checks; payload encoding is the caller's dict -> JSON.",
        "relay: SKIP LOCKED with leases; strict per-key ordering takes an advisory lock per "
        "claim (strict=False drops it: the sweep tries both, the best is kept); one UPDATE "
        "acks the whole batch.",
    ),
    why_not_everywhere="PostgreSQL only (asyncpg adapter; its other adapter is SQLite)",
)

FASTSTREAM = Peer(
    name="faststream-outbox",
    runner="faststream_outbox",
    databases=(POSTGRESQL,),
    requirements=("faststream-outbox==0.19.0", "faststream==0.7.8", "SQLAlchemy==2.0.58",
                  "asyncpg==0.32.0"),
    publish={"faststream-outbox": {}},
    drain={POSTGRESQL: [{"batch": b, "workers": w, "flush": f}
                        for b, w, f in ((100, 4, 100), (500, 8, 100), (500, 16, 100),
                                        (1000, 16, 500))]},
    notes=(
        "asyncio SQLAlchemy over asyncpg; publish writes queue, payload, headers and emits "
        "pg_notify in the same statement; no idempotency key (optional timer_id), no length "
        "checks.",
        "the table is the queue: the drain is its subscriber calling a no-op handler; a "
        "handled row is DELETEd (not marked), in batches of `flush` rows. Its defaults (batch "
        "10, 1 worker, flush 1) drained about 300 rows/s here: the sweep tries larger ones.",
    ),
    why_not_everywhere="PostgreSQL only (JSONB, LISTEN/NOTIFY, partial indexes)",
)

DJANGO_OUTBOX_PATTERN = Peer(
    name="django-outbox-pattern",
    runner="django_outbox_pattern",
    databases=(MYSQL, POSTGRESQL),
    requirements=("django-outbox-pattern==3.2.1", "stomp.py==8.2.0",
                  "request-id-django-log==0.2.0", *_DJANGO),
    publish={"django-outbox-pattern": {}},
    drain={db: [{"chunk": c} for c in (200, 2000)] for db in (MYSQL, POSTGRESQL)},
    sweep_rows=1000,
    dedupe=True,
    notes=(
        "Django ORM (PyMySQL as MySQLdb on MariaDB, psycopg 3 on PostgreSQL, persistent "
        "connections); publish is `Published.objects.create(...)`: a UUID key, JSON body and "
        "headers, no idempotency key on the producer side, no length checks.",
        "the relay selects every due row FOR UPDATE SKIP LOCKED in ONE transaction (the whole "
        "backlog stays locked until the end; `chunk` is the iterator's fetch size), sends each "
        "over STOMP (here a no-op connection) and saves each row with a full-row UPDATE: one "
        "round trip per row, one commit per pass.",
        "dedupe: `exists()` on the received table, then the callback runs "
        "`with transaction.atomic(): insert; payload.save()` as its README says; the check is "
        "outside that transaction (two concurrent deliveries both pass it; the unique msg_id "
        "then fails the second `payload.save()`, its effect rolls back and the message is "
        "nacked without requeue: no double effect, but not a clean duplicate either).",
    ),
)

JAIMINHO = Peer(
    name="django-jaiminho",
    runner="jaiminho",
    databases=(MYSQL, POSTGRESQL),
    requirements=("django-jaiminho==2.2.1", "dill==0.4.0", "sentry-sdk==2.75.0", *_DJANGO),
    publish={"django-jaiminho (keep-order)": {"strategy": "keep-order"},
             "django-jaiminho (on-commit, default)": {"strategy": "publish-on-commit"}},
    drain={db: [{"delete": d} for d in (False, True)] for db in (MYSQL, POSTGRESQL)},
    sweep_rows=300,
    notes=(
        "Django ORM; the outbox row holds the dill-pickled function, its args and an HMAC "
        "signature (SIGN_EVENTS, the default); no idempotency key, no length checks.",
        "publish-on-commit (the default) writes NOTHING in the transaction: it calls the "
        "function from Django's on_commit hook, synchronously inside the caller's commit, and "
        "stores a row only if that call fails - a crash between commit and send loses the "
        "message: not a transactional outbox. keep-order writes the row in the transaction.",
        "the relay reads all unsent rows, then per row: a transaction, SELECT ... FOR UPDATE "
        "(keep-order: without SKIP LOCKED, so one relay at a time), signature check, unpickle, "
        "call, full-row UPDATE (or DELETE with DELETE_AFTER_SEND): 3 round trips + a commit per "
        "row. Its rate falls as the backlog grows (about 250 rows/s on the 300-row sweep, "
        "40-150 on a few thousand rows here), so the budget's smaller backlog flatters it.",
    ),
)

PEERS = (CKIT, TXOUTBOX, FASTSTREAM, DJANGO_OUTBOX_PATTERN, JAIMINHO)

#: looked at and left out (printed with the report, so nobody wonders)
LEFT_OUT = (
    "outbox-pattern 0.1.2, event-outbox 0.4.0: MongoDB outboxes (no SQL database)",
    "python-eventflow 1.0.1: inbox only (its OutboxPublisher raises NotImplementedError)",
    "event-forge 1.5.0: asyncio SQLAlchemy inbox/outbox tied to RabbitMQ (aio-pika); a "
    "candidate for a later runner",
    "django-celery-outbox 0.4.3: an outbox for Celery task calls, not messages",
)


def by_name(names: str) -> list[Peer]:
    """Peers named in a comma list ("all" for every one); consumer-kit always comes first."""
    if names == "all":
        return list(PEERS)
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {p.name for p in PEERS}
    if unknown:
        raise SystemExit(f"unknown peer(s): {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(p.name for p in PEERS)}")
    return [p for p in PEERS if p.name in wanted or p is CKIT]
