"""Printing results: aligned tables, JSON, one-row totals."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import typer


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print rows as an aligned plain-text table."""
    text_rows = [["" if v is None else str(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(v)) for w, v in zip(widths, row)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    typer.echo(line)
    typer.echo("  ".join("-" * w for w in widths))
    for row in text_rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def print_totals(totals: dict[str, Any], as_json: bool) -> None:
    """Print a one-row summary of counters, as a table or (with `--json`) as JSON."""
    if as_json:
        print_json(totals)
    else:
        print_table(list(totals), [list(totals.values())])


def print_json(data: Any) -> None:
    """Print `data` as JSON (datetimes and other objects as strings)."""
    typer.echo(json.dumps(data, default=str, indent=2, sort_keys=True))
