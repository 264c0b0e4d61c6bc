"""Django configured from a job, as a team would run it in production: DEBUG off, persistent
connections (CONN_MAX_AGE=None), PyMySQL as MySQLdb on MariaDB (the driver consumer-kit uses
there), psycopg 3 on PostgreSQL. Tables are created with the schema editor under the job's
prefix (the peers' fixed table and index names are renamed so runs never collide)."""

from __future__ import annotations

import os
from typing import Any

from bench.peers import harness


def configure(job: dict[str, Any], app: str, **extra: Any) -> harness.Db:
    """Configure and set up Django for `app` (plus the bench's own djapp)."""
    db = harness.Db.from_url(job["url"])
    os.environ["CKIT_PEERS_PREFIX"] = job["prefix"]
    if db.kind == "mysql":
        import pymysql

        pymysql.install_as_MySQLdb()
        engine = "django.db.backends.mysql"
    else:
        engine = "django.db.backends.postgresql"
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="peer-bench-only",
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["bench.peers.runners.djapp", app],
        DATABASES={"default": {"ENGINE": engine, "NAME": db.name, "USER": db.user,
                               "PASSWORD": db.password, "HOST": db.host, "PORT": db.port,
                               "CONN_MAX_AGE": None}},
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
        **extra,
    )
    django.setup()
    return db


def rename(model: Any, table: str) -> None:
    """Give a peer's model a unique table name (and its named indexes unique names)."""
    model._meta.db_table = table
    for i, index in enumerate(model._meta.indexes):
        index.name = f"{table[-24:]}_ix{i}"


def create(*models: Any) -> None:
    from django.db import connection

    with connection.schema_editor() as editor:
        for model in models:
            editor.create_model(model)


def drop(*models: Any) -> None:
    from django.db import connection

    with connection.schema_editor() as editor:
        for model in models:
            editor.delete_model(model)


def analyze(model: Any) -> None:
    """Fresh planner statistics after a bulk fill (every runner does the same)."""
    from django.db import connection

    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(("ANALYZE TABLE " if connection.vendor == "mysql" else "ANALYZE ") + table)
        if cursor.description:
            cursor.fetchall()


def truncate(model: Any) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE TABLE " + connection.ops.quote_name(model._meta.db_table))
