"""From the runners' JSON to the printed tables: per-database detail tables, the summary table of
issue 17, and the differences in semantics that make the comparison unfair."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from bench.common import table
from bench.peers.catalog import PEERS, Peer
from bench.peers.jobs import JobResult

DB_TITLE = {"mysql": "MariaDB", "postgresql": "PostgreSQL"}
CKIT_CONNECTION = "consumer-kit (Connection)"
CKIT_SESSION = "consumer-kit (Session + Dispatcher)"
#: rows that are not a transactional outbox: shown, never the "best peer"
NOT_AN_OUTBOX = ("django-jaiminho (on-commit, default)",)


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def publish_stats(runs: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the runs: ms of each variant, and for each non-bare variant its ratio to
    bare and the ms it adds (each computed per run, then the median)."""
    out: dict[str, float] = {}
    for name in runs[0]:
        out[name] = med([r[name] for r in runs])
        if name != "bare":
            out[f"{name}_x"] = med([r[name] / r["bare"] for r in runs])
            out[f"{name}_added"] = med([r[name] - r["bare"] for r in runs])
    return out


def drain_stats(data: dict[str, Any]) -> dict[str, Any]:
    rates = [r["rate"] for r in data["runs"]]
    return {"rate": med(rates), "min": min(rates), "max": max(rates), "rows": data["rows"],
            "best": data["best"], "reduced": data["reduced"], "sweep": data["sweep"]}


def setting_text(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def of(results: list[JobResult], db: str, measure: str) -> list[JobResult]:
    return [r for r in results if r.db == db and r.measure == measure and not r.error]


def publish_table(results: list[JobResult], db: str) -> str:
    rows = []
    ckit = next((publish_stats(r.data["runs"]) for r in of(results, db, "publish")
                 if r.label == CKIT_CONNECTION), None)
    for r in of(results, db, "publish"):
        s = publish_stats(r.data["runs"])
        floor = (f"{s['floor']:.2f} ({s['floor_x']:.2f}x, +{s['floor_added']:.2f})"
                 if "floor" in s else "-")
        vs_floor = (f"{s['publish_added'] / s['floor_added']:.2f}x"
                    if "floor" in s and s["floor_added"] > 0 else "-")
        vs_ckit = f"{s['publish_added'] / ckit['publish_added']:.2f}x" if ckit else "-"
        rows.append([r.label, f"{s['bare']:.2f}", floor, f"{s['publish']:.2f}",
                     f"{s['publish_x']:.2f}x", f"+{s['publish_added']:.2f}", vs_floor, vs_ckit])
        if "core" in s:
            rows.append(["  same row, prebuilt Core insert()", "", "", f"{s['core']:.2f}",
                         f"{s['core_x']:.2f}x", f"+{s['core_added']:.2f}",
                         f"{s['core_added'] / s['floor_added']:.2f}x"
                         if s["floor_added"] > 0 else "-", ""])
    return table(["publish (ms per transaction, medians)", "bare", "floor (x bare, +ms)",
                  "publish", "x bare", "added ms", "added / floor's", "added / ckit's"], rows)


def drain_table(results: list[JobResult], db: str) -> str:
    rows = []
    ckit = next((drain_stats(r.data)["rate"] for r in of(results, db, "drain")
                 if r.peer == "consumer-kit"), None)
    for r in of(results, db, "drain"):
        s = drain_stats(r.data)
        rows.append([r.label, setting_text(s["best"]), f"{s['rows']:,}" + ("*" if s["reduced"]
                                                                            else ""),
                     f"{s['rate']:,.0f}", f"{s['min']:,.0f}-{s['max']:,.0f}",
                     f"{s['rate'] / ckit:.2f}x" if ckit else "-",
                     ", ".join(f"{setting_text(x['setting'])}: {x['rate']:,.0f}"
                               for x in s["sweep"])])
    return table(["drain (one relay process)", "best setting", "rows", "rows/s (median)",
                  "runs", "x ckit", "sweep (rows/s on the sweep backlog)"], rows)


def dedupe_table(results: list[JobResult], db: str) -> str:
    rows = []
    for r in of(results, db, "dedupe"):
        s = publish_stats(r.data["runs"])
        floor = s.get("floor_added")
        if floor:
            rows.append([r.label, "floor: bare + one INSERT of the processed row",
                         f"{s['bare']:.2f}", f"{s['floor']:.2f}", f"{s['floor_x']:.2f}x",
                         f"+{floor:.2f}", "-", "-"])
        for mode, rate in r.data["duplicates"].items():
            over = f" ({s[mode + '_added'] / floor:.2f}x floor's)" if floor else ""
            rows.append([r.label, mode, f"{s['bare']:.2f}", f"{s[mode]:.2f}",
                         f"{s[mode + '_x']:.2f}x", f"+{s[mode + '_added']:.2f}{over}",
                         f"{rate:,.0f}",
                         "ok" if r.data["effects"] == r.data["effects_expected"] else
                         f"{r.data['effects']} != {r.data['effects_expected']}"])
        if "ping_rate" in r.data:
            rows.append([r.label, "Redis PING, same thread (a duplicate's floor)", "-", "-",
                         "-", "-", f"{r.data['ping_rate']:,.0f}", "-"])
    return table(["dedupe (handler inserting one row)", "mode", "bare ms", "decorated ms",
                  "x bare", "added ms", "duplicates rejected/s", "effects"], rows)


def summary(results: list[JobResult], dbs: Sequence[str]) -> str:
    """The table of issue 17: consumer-kit, the best peer of the same run, the others."""
    rows: list[list[str]] = []
    for db in dbs:
        title = DB_TITLE[db]
        pub = {r.label: publish_stats(r.data["runs"]) for r in of(results, db, "publish")}
        if CKIT_CONNECTION in pub:
            c = pub.pop(CKIT_CONNECTION)
            pub.pop(CKIT_SESSION, None)
            ranked = sorted((s["publish_added"], label) for label, s in pub.items()
                            if label not in NOT_AN_OUTBOX)
            best = ranked[0][1] if ranked else ""
            rows.append([f"publish, {title} (x bare, added per tx)",
                         f"{c['publish_x']:.2f}x, +{c['publish_added']:.2f} ms",
                         _pub(best, pub[best]) if best else "-",
                         "; ".join(_pub(label, s) for label, s in pub.items() if label != best)
                         or "-"])
            rows.append([f"floor: one hand-written INSERT, {title}",
                         f"{c['floor_x']:.2f}x, +{c['floor_added']:.2f} ms "
                         f"(publish adds {c['publish_added'] / c['floor_added']:.2f}x the "
                         "floor's)" if c["floor_added"] > 0 else "-", "-", "-"])
    sess = [(db, publish_stats(r.data["runs"])) for db in dbs for r in of(results, db, "publish")
            if r.label == CKIT_SESSION]
    if sess:
        rows.append([f"publish with the after-commit dispatcher, "
                     f"{' / '.join(DB_TITLE[db] for db, _ in sess)}",
                     " / ".join(f"{s['publish_x']:.2f}x, +{s['publish_added']:.2f} ms "
                                f"({s['publish_added'] / s['floor_added']:.2f}x floor's)"
                                for _, s in sess), "-", "-"])
    for db in dbs:
        drains = {r.label: drain_stats(r.data)["rate"] for r in of(results, db, "drain")}
        if "consumer-kit" in drains:
            c_rate = drains.pop("consumer-kit")
            ranked = sorted(drains.items(), key=lambda kv: -kv[1])
            rows.append([f"relay drain, {DB_TITLE[db]}, best settings (rows/s)",
                         f"{c_rate:,.0f}",
                         f"{ranked[0][0]} {ranked[0][1]:,.0f} ({ranked[0][1] / c_rate:.2f}x)"
                         if ranked else "-",
                         "; ".join(f"{k} {v:,.0f}" for k, v in ranked[1:]) or "-"])
    for db in dbs:
        dd = {r.label: r for r in of(results, db, "dedupe")}
        c = dd.pop("consumer-kit", None)
        if c is not None:
            s = publish_stats(c.data["runs"])
            d = c.data["duplicates"]
            others = [(label, publish_stats(r.data["runs"]), r.data["duplicates"])
                      for label, r in dd.items()]
            adaptive = "adaptive" in d
            floor = (f"; floor (one INSERT of the processed row) {s['floor_x']:.2f}x: Redis "
                     f"adds {s['redis_added'] / s['floor_added']:.2f}x the floor's"
                     + (f", adaptive {s['adaptive_added'] / s['floor_added']:.2f}x"
                        if adaptive else "")
                     if s.get("floor_added") else "")
            names = {"redis": "Redis", "adaptive": "Redis adaptive", "database": "database only"}
            modes = " / ".join(names.get(m, m) for m in d)
            x = " / ".join(f"{s[m + '_x']:.2f}x" for m in d)
            rows.append([f"dedupe, decorated vs bare, {modes} ({DB_TITLE[db]})",
                         f"{x}{floor}",
                         "; ".join(f"{label} {o['decorated_x']:.2f}x" for label, o, _ in others)
                         or "-", "-"])
            rates = " / ".join(f"{d[m]:,.0f}" for m in d)
            over = ", ".join(f"{d[m] / d['database']:.1f}x" for m in d if m != "database")
            ping = (f"; Redis PINGs/s on that thread: {c.data['ping_rate']:,.0f}"
                    if "ping_rate" in c.data else "")
            rows.append([f"duplicates rejected/s, {modes} ({DB_TITLE[db]})",
                         f"{rates} ({over}){ping}",
                         "; ".join(f"{label} {dup['decorated']:,.0f}"
                                   for label, _, dup in others) or "-", "-"])
    return table(["measure", "consumer-kit", "best peer (same run)", "others"], rows)


def _pub(label: str, s: dict[str, float]) -> str:
    return f"{label} {s['publish_x']:.2f}x, +{s['publish_added']:.2f} ms"


def unfairness(results: list[JobResult], dbs: Sequence[str], budget: float,
               rows: int) -> list[str]:
    """Every difference in semantics or setup that a reader must weigh, as bullet lines."""
    ran = {r.peer for r in results}
    lines = [
        "Each row's bare transaction is its own stack's (asyncpg, SQLAlchemy asyncio, Django "
        "ORM, SQLAlchemy + PyMySQL/psycopg): x bare compares a peer with itself; compare the "
        "added ms across peers.",
        "The floor is the same outbox row written by one hand-written INSERT in the same "
        "transaction (values built by the cheapest obvious code); it is the cost of one more "
        "statement, the least any outbox can add.",
        f"Drains start from {rows:,} pending rows; a relay that cannot drain them within "
        f"{budget:.0f} s gets rate x {budget:.0f} s rows instead (marked *), so slow relays "
        "are timed on smaller backlogs, which flatters any relay whose cost grows with the "
        "backlog.",
        "The 'django-jaiminho (on-commit, default)' row is not a transactional outbox (no row "
        "in the transaction) and is never the best peer.",
    ]
    for peer in PEERS:
        if peer.name not in ran:
            continue
        if peer.why_not_everywhere and len(dbs) > 1:
            lines.append(f"{peer.name}: {peer.why_not_everywhere}; not run on "
                         f"{', '.join(DB_TITLE[d] for d in dbs if d not in peer.databases)}.")
        lines += [f"{peer.name}: {note}" for note in peer.notes]
    return lines


def failures(results: list[JobResult]) -> list[str]:
    return [f"[{r.db}] {r.label} {r.measure}: {r.error}" for r in results if r.error]


def peer_versions(results: list[JobResult], peers: Sequence[Peer]) -> list[str]:
    seen: dict[str, dict[str, str]] = {}
    for r in results:
        if r.data.get("versions"):
            seen.setdefault(r.peer, r.data["versions"])
    return [f"{p.name}: " + ", ".join(f"{k} {v}" for k, v in seen[p.name].items())
            for p in peers if p.name in seen]
