"""What every bench script prints: the command line, machine facts, percentiles."""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shlex
import statistics
import sys
from collections.abc import Sequence

import sqlalchemy as sa

from consumer_kit.core.urls import mask_text


def machine_facts(engine: sa.engine.Engine | None = None) -> str:
    """One paragraph: command (passwords masked), CPU, RAM, Python, SQLAlchemy, database
    server version."""
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        f"command : {mask_text(shlex.join([sys.executable.rsplit('/', 1)[-1], *sys.argv]))}",
        f"machine : {os.cpu_count()} cores ({cpu}), {mem_gb:.1f} GiB RAM, {platform.platform()}",
        f"python  : {platform.python_version()}, sqlalchemy {sa.__version__}",
        f"load    : {load_average()} (1/5/15 min; other work on this machine skews figures)",
    ]
    if engine is not None:
        with engine.connect() as conn:
            if engine.dialect.name in ("mysql", "mariadb"):
                version = conn.execute(sa.text("SELECT VERSION()")).scalar()
            elif engine.dialect.name == "sqlite":
                version = "sqlite " + str(conn.execute(sa.text("SELECT sqlite_version()")).scalar())
            elif engine.dialect.name == "postgresql":
                version = str(conn.execute(sa.text("SELECT version()")).scalar()).split(" on ")[0]
            else:
                version = engine.dialect.name
        lines.append(f"database: {version}")
    return "\n".join(lines)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, e.g. `0.52 0.61 0.70`."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary_us(values: Sequence[float]) -> str:
    """`p50/p99/mean` of seconds, printed in microseconds."""
    return (f"p50 {percentile(values, 50) * 1e6:8.0f} us  "
            f"p99 {percentile(values, 99) * 1e6:8.0f} us"
            f"  mean {statistics.fmean(values) * 1e6 if values else 0:8.0f} us")


def rss_mb() -> float:
    """Current resident set size in MiB (from /proc, falls back to the peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned table."""
    text = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(headers)]
    out = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in text]
    return "\n".join(out)


def parse_counts(parser: argparse.ArgumentParser, argv: list[str] | None,
                 *counts: str) -> argparse.Namespace:
    """Add `--runs` (default 3) to `parser`, parse `argv`, and refuse (one line, exit 2) a
    `--runs` or any of the options `counts` (e.g. `"--n"`) under 1."""
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    names = [*counts, "--runs"]
    if any(getattr(args, name.lstrip("-").replace("-", "_")) < 1 for name in names):
        parser.error(f"{' and '.join(names)} must be at least 1")
    return args
