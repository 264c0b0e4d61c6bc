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

from consumer_kit.ack_sender import AckRoute, AckSender, SqlRoute, TopicRoute
from consumer_kit.db import check_tables, make_engine
from consumer_kit.dedupe import RecentlyDone, RedisDedupe
from consumer_kit.dedupe.redis_store import DEFAULT_DONE_TTL, DEFAULT_LEASE
from consumer_kit.errors import ConfigError, DatabaseUnavailable
from consumer_kit.identifiers import validate_identifier
from consumer_kit.listeners import (
    DedupeKey,
    Handler,
    Listener,
    Router,
    check_options,
    topic_from_name,
    wants_session,
)
from consumer_kit.pipeline import Pipeline
from consumer_kit.processed import ProcessedStore
from consumer_kit.runner import Activity, run_consumer
from consumer_kit.schema import DEFAULT_PROCESSED_TABLE, GROUP_LEN, processed_table
from consumer_kit.transports import open_transport
from consumer_kit.transports.base import ConsumeStatus, Delivery, Transport, Verdict
from consumer_kit.urls import mask_url

log = logging.getLogger("consumer_kit.app")

F = TypeVar("F", bound=Handler)

DEFAULT_THREADS = 4
DEFAULT_LOCAL_CACHE = 100_000


class ConsumerApp:
    """One consumer group's listeners, with deduplication and acks.

    >>> app = ConsumerApp(group="inventory", db="sqlite:///inventory.db", redis=None,
    ...                   transport="memory://demo", ack="topic")
    >>> @app.listener("ORDER_CREATED", tags="*")
    ... def reserve_stock(msg, session):
    ...     order = msg.json()

    Args:
        group: the consumer group (also the key of the processed rows).
        db: URL or Engine of the consumer's database (holds the processed table).
        redis: URL, client, or None for the database-only configuration.
        transport: transport URL (or object) to consume from; `ckit consume --transport`
            overrides it.
        ack: `"topic"` (ack messages on the producer's ack topic over the same transport), a
            SQLAlchemy URL of the producer's database (applied there directly), an `AckRoute`
            of your own, or None (off).
        permanent_errors: exception types that reject a message instead of retrying it.
    """

    def __init__(
        self,
        *,
        group: str,
        db: str | Engine,
        redis: str | redis_lib.Redis | None = None,
        transport: str | Transport | None = None,
        ack: str | AckRoute | None = "topic",
        processed_table: str = DEFAULT_PROCESSED_TABLE,
        permanent_errors: tuple[type[BaseException], ...] = (),
        done_ttl: dt.timedelta = DEFAULT_DONE_TTL,
        lease: dt.timedelta = DEFAULT_LEASE,
        threads: int = DEFAULT_THREADS,
        local_cache: int = DEFAULT_LOCAL_CACHE,
        ack_outbox_table: str | None = None,
        ack_table: str | None = None,
    ) -> None:
        if not group or len(group) > GROUP_LEN:
            raise ConfigError(f"invalid consumer group {group!r}")
        self.group = group
        self.db = db
        self.redis_config = redis
        self.transport_config = transport
        self.ack = ack
        self.processed_table = validate_identifier(processed_table)
        self.permanent_errors = tuple(permanent_errors)
        self.done_ttl = done_ttl
        self.lease = lease
        self.threads = threads
        self.local_cache = local_cache
        self.ack_tables = (ack_outbox_table, ack_table)
        self.router = Router()
        self._pipeline: Pipeline | None = None
        self._transport: Transport | None = None
        self._acks: AckSender | None = None
        self._lock = threading.RLock()
        self._redis_from_url: tuple[str, redis_lib.Redis] | None = None
        self.activity = Activity()

    # -- declaring listeners ---------------------------------------------------------------

    @overload
    def listener(self, topic: F, /) -> F: ...

    @overload
    def listener(self, topic: str | None = None, /, *, tags: str = "*",
                 dedupe_key: DedupeKey | None = None,
                 permanent: tuple[type[BaseException], ...] = (),
                 **unknown: Any) -> Callable[[F], F]: ...

    def listener(self, topic: Any = None, /, **options: Any) -> Any:
        """Register a handler for `topic` (and `tags`, RocketMQ expression, default `*`).

        Usable bare (`@app.listener`, topic = the function name upper-cased) or with
        arguments. The function stays callable as it was, for tests. Options: `tags`,
        `dedupe_key` (a function `Message -> str` for messages without an outbox id),
        `permanent` (exception types this listener treats as permanent).

        Raises:
            ConfigError: an unknown option, a duplicate topic/tags, or a bad signature.
        """
        check_options(options)
        if callable(topic):
            return self._register(topic, None, options)

        def decorate(fn: F) -> F:
            return self._register(fn, topic, options)

        return decorate

    def _register(self, fn: F, topic: str | None, options: dict[str, Any]) -> F:
        session = wants_session(fn)
        self.router.add(Listener(
            topic=topic or topic_from_name(fn), tags=options.get("tags", "*") or "*", fn=fn,
            wants_session=session, dedupe_key=options.get("dedupe_key"),
            permanent=tuple(options.get("permanent", ())),
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
        """The transport to consume from (`override` wins over the constructor's)."""
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
                client = redis_lib.Redis.from_url(config, socket_timeout=0.5,
                                                  socket_connect_timeout=0.5)
                self._redis_from_url = (config, client)
            return self._redis_from_url[1]

    def _redis(self) -> RedisDedupe | None:
        client = self._redis_client()
        if client is None:
            return None
        return RedisDedupe(client, self.group, lease=self.lease, done_ttl=self.done_ttl)

    def _ack_route(self) -> AckRoute | None:
        if self.ack is None or isinstance(self.ack, AckRoute):
            return self.ack
        if self.ack == "topic":
            return TopicRoute(self.transport())
        if "://" in self.ack:
            outbox, acks = self.ack_tables
            return SqlRoute(self.ack, outbox_table=outbox, ack_table=acks)
        raise ConfigError(
            f"invalid ack={mask_url(self.ack)!r}: use 'topic', a database URL or None")

    def pipeline(self) -> Pipeline:
        """The message pipeline (built on first use)."""
        with self._lock:
            if self._pipeline is None:
                route = self._ack_route()
                self._acks = AckSender(route, self.group) if route else None
                self._pipeline = Pipeline(
                    group=self.group, engine=self.engine, router=self.router,
                    store=ProcessedStore(self.engine, self.group, table=self.processed_table),
                    redis=self._redis(), recent=RecentlyDone(self.local_cache),
                    acks=self._acks, permanent=self.permanent_errors,
                )
            return self._pipeline

    def check(self) -> None:
        """Fail fast at start-up: listeners exist, the database and table answer, Redis answers.

        Raises:
            ConfigError: no listeners, or Redis unreachable.
            DatabaseUnavailable: the database cannot be reached.
            SchemaError: the processed table is missing (run `ckit db init`).
        """
        if not self.router.listeners:
            raise ConfigError(f"consumer group {self.group!r} has no listeners")
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
                raise ConfigError(f"redis at {where} unreachable: {exc}") from None

    # -- running ---------------------------------------------------------------------------

    def process(self, delivery: Delivery) -> ConsumeStatus | Verdict:
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
    ) -> None:
        """Consume until `stop` is set (or, with `burst`, until nothing is left)."""
        self.check()
        source = self.transport(transport)
        for sub in self.router.subscriptions():
            source.ensure_topic(sub.topic)
        self.pipeline()
        consumer = source.consumer(self.group, self.router.subscriptions(), self.process,
                                   threads=threads or self.threads)
        run_consumer(consumer, stop or threading.Event(), burst=burst, max_seconds=max_seconds,
                     activity=self.activity)
        if self._acks is not None:
            self._acks.flush()

    def close(self) -> None:
        """Flush acks and release connections."""
        if self._acks is not None:
            self._acks.close()
        if self._pipeline is not None and self._pipeline.redis is not None:
            self._pipeline.redis.close()
        if self._transport is not None:
            self._transport.close()
        if isinstance(self.db, Engine):
            self.db.dispose()
