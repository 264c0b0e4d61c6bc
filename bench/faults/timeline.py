"""The run over time: outbox backlog by state sampled every second, effects per second from the
effect rows' own timestamps, and the picture (PNG) with the faults as markers.

The sampler reads the producer's database; while the database is down a sample is missing (a gap in
the backlog lines), never a wrong number. Effects per second come from the effect rows written
by the handlers (`at`, the handler's clock), so they have no gap.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.faults import kit, world

SAMPLE_INTERVAL = 1.0
MARKERS = {
    "kill-producer": ("v", "tab:blue"), "kill-relay": ("v", "tab:orange"),
    "kill-consume": ("v", "tab:green"), "kill-receipts": ("v", "tab:purple"),
    "redis-flush": ("x", "tab:red"), "redis-kill": ("X", "tab:red"),
    "mariadb-kill": ("D", "black"), "postgres-kill": ("D", "tab:cyan"),
    "broker-kill": ("s", "tab:brown"),
    "namesrv-kill": ("P", "tab:brown"), "proxy-kill": ("s", "tab:olive"),
    "dup-storm": ("*", "tab:pink"),
}
STATES_SHOWN = ("PENDING", "SENDING", "SENT", "FAILED")


@dataclasses.dataclass
class Sample:
    t: float
    states: dict[str, int]


class Sampler:
    """A thread that counts outbox rows by state every `interval` seconds."""

    def __init__(self, orders_url: str, clock: Callable[[], float],
                 interval: float = SAMPLE_INTERVAL) -> None:
        self.engine = world.engine(orders_url)
        self.clock = clock
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults-sampler", daemon=True)
        self._outbox = sa.table(kit.OUTBOX_TABLE, sa.column("state"))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.dispose()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            t = self.clock()
            try:
                with self.engine.connect() as conn:
                    rows = conn.execute(sa.select(self._outbox.c.state, sa.func.count())
                                        .group_by(self._outbox.c.state)).all()
            except sa.exc.DBAPIError:
                continue  # the database down: no sample
            self.samples.append(Sample(round(t, 2), {kit.STATE_NAMES.get(int(s), str(s)): int(n)
                                                     for s, n in rows}))


def per_second(times: Sequence[float], t0: float, end: float, width: float = 1.0) -> list[int]:
    """Counts of `times` (seconds since `t0`) in bins of `width` seconds from 0 to `end`."""
    bins = [0] * (int(end // width) + 1)
    for t in times:
        i = int((t - t0) // width)
        if 0 <= i < len(bins):
            bins[i] += 1
    return bins


def render(path: Path, *, title: str, effect_times: Sequence[float], t0: float, end: float,
           samples: Sequence[Sample], faults: Sequence[dict[str, Any]],
           converged_at: float | None) -> None:
    """Write the PNG: effects per second on top, backlog by outbox state below, faults as
    markers on both (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 1.0 if end <= 900 else 5.0
    bins = per_second(effect_times, t0, end, width)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(15, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1]})
    top.plot([i * width for i in range(len(bins))], [b / width for b in bins],
             lw=0.8, color="tab:green")
    top.set_ylabel("effects per second" + (f" ({width:g} s bins)" if width != 1 else ""))
    top.set_title(title, fontsize=10)
    for state in STATES_SHOWN:
        xs = [s.t for s in samples]
        ys = [s.states.get(state, 0) for s in samples]
        if any(ys):
            bottom.plot(xs, ys, lw=0.9, label=state)
    bottom.set_ylabel("outbox rows by state")
    bottom.set_xlabel("seconds since the producer started")
    bottom.set_yscale("symlog", linthresh=10)
    seen: set[str] = set()
    top_y = max([b / width for b in bins] or [1])
    for f in faults:
        marker, color = MARKERS.get(f["kind"], ("o", "gray"))
        label = f["kind"] if f["kind"] not in seen else None
        seen.add(f["kind"])
        top.scatter([f["at"]], [top_y * 1.05], marker=marker, color=color, s=45, label=label,
                    zorder=3)
        for ax in (top, bottom):
            ax.axvline(f["at"], color=color, lw=0.4, alpha=0.5)
    if converged_at is not None:
        for ax in (top, bottom):
            ax.axvline(converged_at, color="black", lw=1.2, ls="--")
        top.annotate("converged", (converged_at, top_y * 0.9), fontsize=8)
    top.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, title="faults",
               title_fontsize=8)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
                  title="outbox state", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
