"""The run's figures: the machine-readable report (JSON-ready dict) and its text form.

Besides the checks it derives, from the effect rows' timestamps, how long effects stopped after
each fault (the longest effect-free stretch in the minute after it, while orders still flowed),
and per consumer process whether it went silent while the other kept applying (the RocketMQ
native client is known to drop its pull requests after a broker restart).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.faults import checks, kit, logscan, settle, world
from bench.faults.processes import HANG_AFTER

if TYPE_CHECKING:
    from bench.faults.scenario import Config, Run
    from bench.faults.timeline import Sample

PAUSE_WINDOW = 60.0
LATENCY_AROUND = 5.0
SILENT_AFTER = 60.0  # the SQL transport's consumer lease is 30 s
#: reconciler classes that bring a row to CONSUMED (directly, or through a re-send)
TO_CONSUMED = ("receipt_lost", "ack_lost", "retry", "stuck_sending")  # ack_lost: before 0.2


def effect_rows(inventory: Engine) -> list[tuple[int, int, float]]:
    """Every effect row as (order_id, pid, wall time), oldest first."""
    e = world.effects
    with inventory.connect() as conn:
        rows = conn.execute(sa.select(e.c.order_id, e.c.pid, e.c.at).order_by(e.c.at)).all()
    return [(int(a), int(b), float(c)) for a, b, c in rows]


def placed_times(orders: Engine) -> dict[int, float]:
    """Each committed order's wall time of placement."""
    o = world.orders
    with orders.connect() as conn:
        return {int(i): float(t) for i, t in conn.execute(sa.select(o.c.id, o.c.placed_at))}


def title(cfg: Config) -> str:
    on = "" if cfg.db == "mariadb" else f" on {cfg.db}"
    return (f"consumer-kit fault run: transport {cfg.transport}{on}, {cfg.messages:,} orders at "
            f"{cfg.rate:.0f}/s, every fault kind x{cfg.repeats}, seed {cfg.seed}, relays "
            f"--claim {cfg.relay_claim}, consumers' redis_claims {cfg.redis_claims}")


def pauses(records: list[dict[str, Any]], times: list[float], flow_stop: float) -> None:
    """Add `pause_s` to each fault record: the longest stretch without an effect that begins
    between the fault and two seconds after its recovery, counted up to the next fault (at most
    a minute, and only while the producer was still placing orders)."""
    for rec, nxt in zip(records, [*records[1:], None]):
        start = rec["at"]
        end = min(start + PAUSE_WINDOW, flow_stop, nxt["at"] if nxt else flow_stop)
        recovered = (rec["restarted_at"] or start) + 2.0
        if end <= start:
            rec["pause_s"] = None
            continue
        i, j = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        points = [start, *times[i:j], end]
        gaps = [b - a for a, b in itertools.pairwise(points) if a <= recovered]
        rec["pause_s"] = round(max(gaps), 1) if gaps else None


def longest_stall(times: list[float], flow_stop: float) -> dict[str, float] | None:
    """The longest stretch without any effect, from the first effect to the end of the flow
    (seconds, from, to): a pause of every consumer at once, which `pauses` (cut at the next fault)
    and `consumers` (silent while others applied) do not show.

    >>> longest_stall([1.0, 2.0, 9.0, 10.0], 11.0)
    {'seconds': 7.0, 'from': 2.0, 'to': 9.0}
    """
    points = [t for t in times if t <= flow_stop]
    if not points:
        return None
    points.append(flow_stop)
    a, b = max(itertools.pairwise(points), key=lambda ab: ab[1] - ab[0], default=(0.0, 0.0))
    return {"seconds": round(b - a, 1), "from": round(a, 1), "to": round(b, 1)}


def latencies(records: list[dict[str, Any]], placed: dict[int, float],
              first_effect: dict[int, float]) -> None:
    """Add `latency_s` to each fault record: the longest commit-to-effect time of the orders
    committed within LATENCY_AROUND seconds of the fault (None for one never applied)."""
    for rec in records:
        near = [o for o, t in placed.items() if abs(t - rec["at"]) <= LATENCY_AROUND]
        waits = [first_effect[o] - placed[o] for o in near if o in first_effect]
        rec["orders_near"] = len(near)
        rec["latency_s"] = round(max(waits), 1) if waits else None


def consumers(run: Run, effects: list[tuple[int, int, float]], stop_t: float) -> list[dict]:
    """Per consumer process (each incarnation): effects, last effect, and whether it stayed up
    silent for SILENT_AFTER seconds or more while the other consumers applied effects."""
    by_pid: dict[int, list[float]] = {}
    for _order, pid, at in effects:
        by_pid.setdefault(pid, []).append(at - (run.flow0 or 0))
    out = []
    for proc in run.supervisor.of_kind("consume"):
        for inc in proc.incarnations:
            mine = by_pid.get(inc.pid, [])
            end = inc.ended if inc.ended is not None else stop_t
            last = mine[-1] if mine else inc.started
            others = sum(1 for pid, ts in by_pid.items() if pid != inc.pid
                         for t in ts if last + 5 < t < end)
            silent = end - last
            out.append({"role": proc.name, "pid": inc.pid, "started": round(inc.started, 1),
                        "ended": round(end, 1), "how": inc.how or "running", "effects": len(mine),
                        "last_effect": round(last, 1) if mine else None,
                        "silent_s": round(silent, 1), "others_meanwhile": others,
                        "went_silent": silent >= SILENT_AFTER and others > 0})
    return out


def build(*, cfg: Config, run: Run, settled: settle.Settled | None,
          final: checks.Snapshot | None, effects: list[tuple[int, int, float]],
          placed: dict[int, float], shutdown: dict[str, float | None],
          samples: list[Sample], flow_end: float, stormed: int) -> dict[str, Any]:
    """The whole report; `ok` is False when an invariant broke or the run could not finish."""
    records = [rec.to_dict() for rec in run.records]
    t0 = run.flow0 or run.wall0
    times = [at - t0 for _o, _p, at in effects]
    producer = run.supervisor.procs.get("producer-1")
    flow_stop = (producer.incarnations[-1].ended or flow_end) if producer and \
        producer.incarnations else flow_end
    pauses(records, times, flow_stop)
    first: dict[int, float] = {}
    for order, _pid, at in effects:
        first.setdefault(order, at - t0)
    latencies(records, {o: t - t0 for o, t in placed.items()}, first)
    problems = checks.problems(final, cfg.messages) if final else ["no final counts"]
    problems += run.errors
    repaired = settled.repaired() if settled else {}
    reconciled = sum(repaired.get(k, 0) for k in TO_CONSUMED)
    before = settled.rounds[0].before if settled and settled.rounds else None
    converged_at = settled.converged_at if settled else None
    rep: dict[str, Any] = {
        "ok": not problems,
        "title": title(cfg),
        "config": {k: str(v) if hasattr(v, "parts") else v
                   for k, v in cfg.__dict__.items()} | {"rate": round(cfg.rate, 2)},
        "machine": kit.mask(kit.machine_facts()),
        "faults": records,
        "faults_by_kind": dict(Counter(r["kind"] for r in records)),
        "stormed_rows": stormed,
        "unplanned_exits": [u.__dict__ for u in run.supervisor.unplanned],
        "final": final.to_dict() if final else None,
        "problems": problems,
        "flow_end_s": round(flow_end, 1),
        "converged_at_s": round(converged_at, 1) if converged_at is not None else None,
        "converge_s": round(converged_at - flow_end, 1) if converged_at is not None else None,
        "without_reconciler": settled.without_reconciler if settled else False,
        "before_reconciler": before,
        "reconcile_rounds": [r.__dict__ for r in settled.rounds] if settled else [],
        "drains": [{"reason": d.reason, "seconds": round(d.ended - d.started, 1),
                    "last_change_s": round(d.last_change, 1)} for d in settled.drains]
        if settled else [],
        "drained_s": round(settled.drains[0].last_change - flow_end, 1)
        if settled and settled.drains else None,
        "repaired_by_class": repaired,
        "reconciled_rows": reconciled,
        "reconciled_share_pct": round(100 * reconciled / cfg.messages, 2),
        "consumers": consumers(run, effects, run.stopped_at or flow_end),
        "longest_stall": longest_stall(times, flow_stop),
        "shutdown_s": shutdown,
        "slow_shutdowns": {k: v for k, v in shutdown.items() if v is not None and v > HANG_AFTER},
        "logs": logscan.scan(cfg.run_dir / "logs"),
        "dead_letters": run.dead_letters,
        "producer_rate": round(cfg.messages / flow_stop, 1) if flow_stop > 0 else None,
        "samples": [{"t": s.t, **s.states} for s in samples],
    }
    rep["verdict"] = verdict(rep, cfg)
    return rep


def verdict(rep: dict[str, Any], cfg: Config) -> str:
    """The one final line: `ok: ...` or `FAIL: ...`."""
    if not rep["ok"]:
        return "FAIL: " + "; ".join(rep["problems"])
    final = rep["final"]
    how = ("without the reconciler" if rep["without_reconciler"] else
           f"with {len(rep['reconcile_rounds'])} reconcile round(s): {rep['reconciled_rows']} "
           f"rows ({rep['reconciled_share_pct']}%) reached CONSUMED only through it")
    on = "" if cfg.db == "mariadb" else f" on {cfg.db}"
    return (f"ok: {cfg.transport}{on}, {final['orders']:,} orders, {len(rep['faults'])} faults of "
            f"{len(rep['faults_by_kind'])} kinds, {final['lost']} lost, {final['doubled']} "
            f"doubled, all CONSUMED {rep['converge_s']}s after the flow ended, {how}")


def text(rep: dict[str, Any]) -> str:
    """The figures as aligned lines (the verdict is printed separately, last)."""
    final = rep["final"] or {}
    lines = ["faults by kind   : " + ", ".join(f"{k} {v}" for k, v in
                                                 sorted(rep["faults_by_kind"].items())),
             f"producer         : {rep['producer_rate']} orders/s achieved (asked "
             f"{rep['config']['rate']}/s)"]
    if final:
        lines += [
            f"orders committed : {final['orders']:,}; outbox rows {final['outbox_rows']:,} "
            f"({final['outbox_keys']:,} distinct orders)",
            f"effects          : {final['effects']:,} ({final['distinct_effects']:,} distinct): "
            f"lost {final['lost']}, doubled {final['doubled']}",
            f"processed rows   : {final['processed']:,} ({final['processed_ok']:,} SUCCEEDED)",
            f"outbox states    : {final['states']}",
        ]
    if rep["before_reconciler"]:
        b = rep["before_reconciler"]
        lines.append(f"left after drain : {b['by_state']} not CONSUMED; SENT by cause "
                     f"{b['sent_by_cause']} (stormed rows in all: {rep['stormed_rows']})")
    lines.append(f"reconciler       : repaired {rep['repaired_by_class'] or 'nothing'} in "
                 f"{len(rep['reconcile_rounds'])} round(s); {rep['reconciled_rows']} rows "
                 f"({rep['reconciled_share_pct']}%) reached CONSUMED only through it")
    lines.append("converged        : " + (
        f"{rep['converge_s']}s after the flow ended (t={rep['converged_at_s']}s); the first "
        f"drain stopped moving {rep['drained_s']}s after the flow ended"
        if rep["converge_s"] is not None else "NO"))
    lines.append("per fault        : at(s) kind target down(s) up-after(s) pause(s) "
                 "max-latency(s) of orders placed within 5 s")
    for r in rep["faults"]:
        up = f"{r['restarted_at'] - r['at']:.1f}" if r["restarted_at"] is not None else "-"
        lines.append(f"  {r['at']:7.1f} {r['kind']:<13} {r['target']:<10} {r['down']:4.1f} "
                     f"{up:>5} {r['pause_s'] if r['pause_s'] is not None else '-':>6} "
                     f"{r['latency_s'] if r['latency_s'] is not None else '-':>6}"
                     + (f"  rows {r['rows']}" if r["rows"] is not None else "")
                     + (f"  [{r['note']}]" if r["note"] else ""))
    for u in rep["unplanned_exits"]:
        lines.append(f"unplanned exit   : {u['name']} pid {u['pid']} code {u['code']} at "
                     f"t={u['t']:.1f}s: {kit.mask(' | '.join(u['last_lines'][-2:]))}")
    if rep["longest_stall"]:
        st = rep["longest_stall"]
        lines.append(f"longest stall    : {st['seconds']}s without any effect (t={st['from']} to "
                     f"t={st['to']}) while the producer placed orders")
    for c in rep["consumers"]:
        if c["went_silent"]:
            lines.append(f"silent consumer  : {c['role']} pid {c['pid']} ({c['how']}): no effect "
                         f"for {c['silent_s']}s after t={c['last_effect']} while others "
                         f"applied {c['others_meanwhile']}")
    if rep["dead_letters"]:
        lines.append(f"dead letters     : {rep['dead_letters']}")
    if rep["logs"]:
        lines.append("role logs        : " + "; ".join(
            f"{role} " + ", ".join(f"{k} {v}" for k, v in counts.items())
            for role, counts in rep["logs"].items()))
    if rep["slow_shutdowns"]:
        lines.append(f"slow shutdowns   : {rep['slow_shutdowns']} (seconds after SIGTERM; over "
                     f"{HANG_AFTER:g}s)")
    return "\n".join(lines)
