"""`ckit outbox show`: one message with its receipt rows."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.db import check_tables
from consumer_kit.core.rows import headers_column, read_headers
from consumer_kit.core.states import OutboxState
from outbox_producer.ops.resolve import resolve
from outbox_producer.ops.tables import OutboxTables


@dataclasses.dataclass(frozen=True)
class MessageView:
    """One outbox row with its receipt rows (what `ckit outbox show` prints)."""

    row: dict[str, Any]
    receipts: list[dict[str, Any]]

    @property
    def state(self) -> OutboxState:
        """The row's state as the enum."""
        return OutboxState(self.row["state"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: state by name, body as text (or base64 when it is not UTF-8)."""
        row = dict(self.row)
        row["state"] = self.state.name
        if row.get("headers") is not None:  # read as stored: shown even when it is not JSON
            headers, defect = read_headers(row["headers"])
            if defect is None:
                row["headers"] = headers
            else:
                row["headers_problem"] = defect
        body = row.get("body")
        if isinstance(body, (bytes, bytearray, memoryview)):
            raw = bytes(body)
            try:
                row["body"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                row["body"] = base64.b64encode(raw).decode("ascii")
                row["body_encoding"] = "base64"
        return {"message": row, "receipts": self.receipts}


def show(engine: Engine, tables: OutboxTables, ident: str) -> list[MessageView]:
    """The rows `ident` names (see `outbox_producer.ops.resolve`: `id:N`, `msg:ID`, `biz:KEY` or
    a bare value), each with its receipt rows sorted by consumer group; empty when none.

    Raises:
        AmbiguousTarget: a bare value matches rows in more than one way.
        SchemaError: a table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    check_tables(engine, tables.outbox, tables.receipts)
    r = tables.receipts
    with engine.connect() as conn:
        views = []
        o = tables.outbox
        columns = [headers_column(o, conn.dialect.name) if c.name == "headers" else c
                   for c in o.columns]
        for row in resolve(conn, o, ident, columns):
            found = conn.execute(
                sa.select(r).where(r.c.message_id == row.message_id).order_by(r.c.consumer_group)
            ).mappings()
            views.append(MessageView(dict(row._mapping), [dict(x) for x in found]))
    return views
