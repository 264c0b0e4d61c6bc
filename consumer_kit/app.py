"""`ConsumerApp`: listener decorators over one consumer group, and running them."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

import redis as redis_lib
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.db import check_tables, make_engine
from consumer_kit.core.errors import ConfigError, DatabaseUnavailable
from consumer_kit.core.identifiers import validate_identifier
from consumer_kit.core.messages import Delivery, Verdict
from consumer_kit.core.schema import DEFAULT_PROCESSED_TABLE, GROUP_LEN, processed_table
from consumer_kit.core.sqlite_files import check_sqlite_path
from consumer_kit.core.urls import mask_url
from consumer_kit.dedupe import RecentlyDone, RedisDedupe
from consumer_kit.dedupe.owner import check_owner, store_identity
from consumer_kit.dedupe.packer import client_options
from consumer_kit.dedupe.redis_store import (
    DEFAULT_DONE_TTL,
    DEFAULT_LEASE,
    check_redis_option,
    check_redis_times,
)
from consumer_kit.dedupe.scripts import release_kept
from consumer_kit.listeners import (
    DEFAULT_TIMEOUT,
    DedupeKey,
    Handler,
    Listener,
    Router,
    check_listener_values,
    check_options,
    exception_types,
    parse_timeout,
    topic_from_name,
    wants_session,
)
from consumer_kit.pipeline import CLAIM_MODES, Pipeline
from consumer_kit.processed import ProcessedStore
from consumer_kit.receipts import (
    ByProducer,
    ReceiptRoute,
    Receipts,
    ReceiptSender,
    SqlRoute,
    TopicRoute,
    check_receipts,
)
from consumer_kit.transports import open_transport
from consumer_kit.transports.base import Transport
from consumer_kit.transports.running import Activity, run_consumer

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Handler)

DEFAULT_THREADS = 4
DEFAULT_LOCAL_CACHE = 100_000


class ConsumerApp:
    """One consumer group's listeners, with deduplication and receipts to the producers.

    >>> app = ConsumerApp(group="inventory", db="sqlite:///inventory.db", redis=None,
    ...                   transport="memory://demo", receipts="topic")
    >>> @app.listener("ORDER_CREATED", tags="*")
    ... def reserve_stock(msg, session):
    ...     order = msg.json()

    Args:
        group: the consumer group (also the key of the processed rows).
        db: URL or Engine of the consumer's database (holds the processed table).
        redis: URL, client, or None for the database-only configuration.
        transport: transport URL (or object) to consume from; `ckit consume --transport`
            overrides it.
        receipts: where receipts to the producers go: `"topic"` (the producer's receipt topic
            over the same transport, applied by `ckit receipts`), a SQLAlchemy URL of the
            producer's database (applied there directly), a `ReceiptRoute` of your own, None
            (off), or a mapping from producer name (the publishing `Outbox`'s `producer`) to
            one of the first four, `"*"` for every producer not named (`ByProducer`).
            Receipts are durable: the processed row owes them until they are delivered.
        permanent_errors: exception types that reject a message instead of retrying it.
        redis_claims: `"every"` (default): every message claims its id in Redis before its
            handler runs (one round trip: done already, held by another consumer, or leased to
            this one). `"adaptive"`: while duplicates are rare, a handler that takes a session
            runs without a Redis claim (the processed row's unique key and row lock, in the
            handler's transaction, decide and serialize; Redis only gets the done markers, in
            batches), and claims come back when duplicates grow frequent: Redis costs what
            the database-only path costs. What that gives up is in the README ("Redis claims").
    """

    def __init__(
        self,
        *,
        group: str,
        db: str | Engine,
        redis: str | redis_lib.Redis | None = None,
        transport: str | Transport | None = None,
        receipts: Receipts = "topic",
        processed_table: str = DEFAULT_PROCESSED_TABLE,
        permanent_errors: tuple[type[BaseException], ...] = (),
        done_ttl: dt.timedelta = DEFAULT_DONE_TTL,
        lease: dt.timedelta = DEFAULT_LEASE,
        threads: int = DEFAULT_THREADS,
        local_cache: int = DEFAULT_LOCAL_CACHE,
        receipt_outbox_table: str | None = None,
        receipt_table: str | None = None,
        redis_claims: str = "every",
    ) -> None:
        if not isinstance(group, str) or not group or len(group) > GROUP_LEN \
                or group != group.strip():  # (a newline read from an environment variable)
            raise ConfigError(f"invalid consumer group {group!r}: text of 1 to {GROUP_LEN} "
                              "characters, without surrounding whitespace")
        if redis_claims not in CLAIM_MODES:
            raise ConfigError(f"redis_claims must be one of {', '.join(CLAIM_MODES)}, "
                              f"not {redis_claims!r}")
        self.redis_claims = redis_claims
        self.group = group
        self.db = db
        check_redis_option(redis)
        self.redis_config = redis
        self.transport_config = transport
        check_receipts(receipts)
        self.receipts = receipts
        self.processed_table = validate_identifier(processed_table)
        self.permanent_errors = exception_types(permanent_errors, "permanent_errors")
        check_redis_times(lease, done_ttl)
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigError(f"threads must be a whole number of at least 1, not {threads!r}")
        if not isinstance(local_cache, int) or isinstance(local_cache, bool) or local_cache < 0:
            raise ConfigError(f"local_cache must be a whole number of ids (0: off), not "
                              f"{local_cache!r}")
        self.done_ttl = done_ttl
        self.lease = lease
        self.threads = threads
        self.local_cache = local_cache
        self.receipt_tables = (receipt_outbox_table, receipt_table)
        self.router = Router()
        self._pipeline: Pipeline | None = None
        self._transport: Transport | None = None
        self._receipts: ReceiptSender | None = None
        self._lock = threading.RLock()
        self._redis_from_url: tuple[str, redis_lib.Redis] | None = None
        self._dedupe: RedisDedupe | None = None
        self.activity = Activity()

    # -- declaring listeners ---------------------------------------------------------------

    @overload
    def listener(self, topic: F, /) -> F: ...

    @overload
    def listener(self, topic: str | None = None, /, *, tags: str = "*",
                 dedupe_key: DedupeKey | None = None,
                 permanent: tuple[type[BaseException], ...] = (),
                 timeout: dt.timedelta | float = DEFAULT_TIMEOUT,
                 **unknown: Any) -> Callable[[F], F]: ...

    def listener(self, topic: Any = None, /, **options: Any) -> Any:
        """Register a handler for `topic` (and `tags`, RocketMQ expression, default `*`).

        Usable bare (`@app.listener`, topic = the function name upper-cased) or with
        arguments. The function stays callable as it was, for tests. Options: `tags`,
        `dedupe_key` (a function `Message -> str` for messages without an outbox id; `None` or
        `""` rejects the message),
        `permanent` (exception types this listener treats as permanent), `timeout` (a
        timedelta or seconds, default 60 s: a handler still running after it is reported, its
        transaction rolled back when it returns and the message redelivered; its Redis lease
        is renewed while it runs).

        Raises:
            ConfigError: an unknown option, a bad timeout, an empty topic, a topic and tag
                another listener already has (it could never be reached).
            HandlerSignatureError: a signature the framework cannot call, or an async
                function (not supported yet: refused rather than never awaited).
        """
        check_options(options)
        if topic is not None and not callable(topic) and (
                not isinstance(topic, str) or not topic.strip()):
            raise ConfigError(f"listener topic must be a non-empty string, not {topic!r} "
                              "(an empty topic could never receive a message)")
        if callable(topic):
            return self._register(topic, None, options)

        def decorate(fn: F) -> F:
            return self._register(fn, topic, options)

        return decorate

    def _register(self, fn: F, topic: str | None, options: dict[str, Any]) -> F:
        session = wants_session(fn)
        tags, dedupe_key = options.get("tags", "*"), options.get("dedupe_key")
        check_listener_values(tags, dedupe_key)
        self.router.add(Listener(
            topic=topic or topic_from_name(fn), tags=tags or "*", fn=fn,
            wants_session=session, dedupe_key=dedupe_key,
            permanent=exception_types(options.get("permanent", ()), "permanent"),
            timeout=parse_timeout(options.get("timeout", DEFAULT_TIMEOUT)),
        ))
        return fn

    # -- wiring ----------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The consumer database engine (made on first use)."""
        if not isinstance(self.db, Engine):
            self.db = make_engine(self.db)
        return self.db

    def transport(self, override: str | Transport | None = None) -> Transport:
        """The transport to consume from (`override` wins over the constructor's).

        Raises:
            ConfigError: `override` is a URL (`ckit consume --transport`, `CKIT_TRANSPORT`) but
                the app was given a Transport object: the URL would silently drop that object's
                options (`ordered_topics`, `max_reconsume_times`, ...), which no URL carries.
        """
        if isinstance(override, str) and isinstance(self.transport_config, Transport):
            raise ConfigError(
                f"transport URL {mask_url(override)!r} (--transport / CKIT_TRANSPORT) would "
                f"replace the {type(self.transport_config).__name__} app {self.group} builds "
                "itself, and its options with it (ordered_topics, max_reconsume_times, ... "
                "cannot be given in a URL): unset it, or have the app build its transport "
                "from the URL")
        with self._lock:
            if self._transport is None or override is not None:
                config = override or self.transport_config
                if config is None:
                    raise ConfigError("no transport configured: pass transport= or --transport")
                self._transport = open_transport(config) if isinstance(config, str) else config
            return self._transport

    def _redis_client(self) -> redis_lib.Redis | None:
        """The Redis client (one per app: the start-up check and the pipeline share it)."""
        config = self.redis_config
        if config is None or not isinstance(config, str):
            return config
        with self._lock:
            if self._redis_from_url is None or self._redis_from_url[0] != config:
                # numbers packed as text: redis-py's connect handshake (SELECT <db>, HELLO 3)
                # would hand hiredis ints it formats unsafely (docs/signals.md)
                client = redis_lib.Redis.from_url(config, socket_timeout=0.5,
                                                  socket_connect_timeout=0.5,
                                                  **client_options())
                self._redis_from_url = (config, client)
            return self._redis_from_url[1]

    def _redis(self) -> RedisDedupe | None:
        """The Redis store (one per client: the start-up check degrades the one the pipeline
        will claim with, without building the pipeline, whose receipt route needs the
        transport `run` is given)."""
        client = self._redis_client()
        if client is None:
            return None
        with self._lock:
            if self._dedupe is None or self._dedupe.client is not client:
                self._dedupe = RedisDedupe(client, self.group, lease=self.lease,
                                           done_ttl=self.done_ttl)
            return self._dedupe

    def _receipt_route(self) -> ReceiptRoute | None:
        if self.receipts is None or isinstance(self.receipts, str | ReceiptRoute):
            return None if self.receipts is None else self._one_route(self.receipts)
        made: dict[str, ReceiptRoute] = {}  # one route per URL: producers sharing a database
        routes: dict[str, ReceiptRoute | None] = {}
        for producer, spec in self.receipts.items():
            if spec is None or isinstance(spec, ReceiptRoute):
                routes[producer] = spec
            else:
                if spec not in made:
                    made[spec] = self._one_route(spec)
                routes[producer] = made[spec]
        return ByProducer(routes)

    def _one_route(self, spec: str | ReceiptRoute) -> ReceiptRoute:
        if isinstance(spec, ReceiptRoute):
            return spec
        if spec == "topic":
            return TopicRoute(self.transport())
        outbox, receipts = self.receipt_tables
        return SqlRoute(spec, outbox_table=outbox, receipt_table=receipts)

    def pipeline(self) -> Pipeline:
        """The message pipeline (built on first use)."""
        with self._lock:
            if self._pipeline is None:
                store = ProcessedStore(self.engine, self.group, table=self.processed_table)
                route = self._receipt_route()
                self._receipts = ReceiptSender(route, store) if route else None
                self._pipeline = Pipeline(
                    group=self.group, engine=self.engine, router=self.router, store=store,
                    redis=self._redis(), recent=RecentlyDone(self.local_cache),
                    receipts=self._receipts, permanent=self.permanent_errors,
                    claims=self.redis_claims,
                )
            return self._pipeline

    def check(self) -> None:
        """Fail fast at start-up: listeners exist, the database and table answer. Redis down
        is no reason not to start: the processed table decides until it is back (a warning,
        `ckit_redis_degraded` = 1).

        Raises:
            ConfigError: no listeners; a SQLite database file that is not there (connecting
                would make an empty one).
            DatabaseUnavailable: the database cannot be reached.
            SchemaError: the processed table is missing (run `ckit db init`).
        """
        if not self.router.listeners:
            raise ConfigError(f"consumer group {self.group!r} has no listeners")
        url = self.engine.url
        if url.get_backend_name() == "sqlite":  # connecting would leave an empty file behind
            try:
                check_sqlite_path(url.database, url.query, must_exist=True)
            except ConfigError as exc:
                raise ConfigError(f"consumer group {self.group!r}: {exc} (misspelt? `ckit db "
                                  "init --url URL` makes it with its tables)") from None
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.DBAPIError as exc:
            raise DatabaseUnavailable(
                f"consumer database {mask_url(str(self.engine.url))} unreachable: "
                f"{str(exc.orig).splitlines()[0] if exc.orig else exc}") from None
        check_tables(self.engine, processed_table(sa.MetaData(), self.processed_table))
        client = self._redis_client()
        if client is not None:
            try:
                client.ping()
            except redis_lib.RedisError as exc:
                config = self.redis_config
                where = mask_url(config) if isinstance(config, str) else "the given client"
                log.warning("group %s: redis at %s unreachable at start (%s); the processed "
                            "table decides until it is back", self.group, where, exc)
                redis_store = self._redis()
                if redis_store is not None:
                    redis_store.degrade("start", exc)
            else:  # two databases behind one group's keys: each acks the other's as duplicates
                check_owner(client, self.group,
                            store_identity(self.engine, self.processed_table), self.done_ttl)

    # -- running ---------------------------------------------------------------------------

    def process(self, delivery: Delivery) -> Verdict:
        """Handle one delivery (the transport callback). Never raises."""
        self.activity.touch()
        return self.pipeline()(delivery)

    def run(
        self,
        *,
        transport: str | Transport | None = None,
        burst: bool = False,
        stop: threading.Event | None = None,
        max_seconds: float | None = None,
        threads: int | None = None,
    ) -> int:
        """Consume until `stop` is set, `max_seconds` pass or (with `burst`) nothing is left;
        return how many handlers were left running at shutdown."""
        self.check()
        source = self.transport(transport)
        # topics are created by the consumer's start, and only where the transport says so
        # (`create_topics`; the SQL transport makes a topic's queues on first use): a missing
        # topic is otherwise an error, not a topic created from a typo
        self.pipeline()
        consumer = source.consumer(self.group, self.router.subscriptions(), self.process,
                                   threads=threads or self.threads)
        left = run_consumer(consumer, stop or threading.Event(), burst=burst,
                            max_seconds=max_seconds, activity=self.activity)
        if self._receipts is not None and not self._receipts.flush(owed=burst):
            log.warning("group %s: receipts still owed at exit; the next start ships them",
                        self.group)
        return left

    def close(self) -> None:
        """Ship the receipts queued (what is left stays owed), release connections."""
        if self._receipts is not None:
            self._receipts.close()
        if self._pipeline is not None:
            self._pipeline.close()
        if self._dedupe is not None:  # the pipeline's, or made by `check` alone
            self._dedupe.close()
        if self._transport is not None:
            self._transport.close()
        if self._redis_from_url is not None:  # ours, and no callback runs any more
            release_kept(self._redis_from_url[1].connection_pool)
        if isinstance(self.db, Engine):
            self.db.dispose()
