"""What the roles' logs say: deadlocks, receipts given up, tracebacks, one-line CLI errors.

Counted per role from `logs/ROLE.log` (every incarnation appends there), so a finding the checks
cannot see (a receipt dropped and later repaired by the reconciler, a deadlock that cost a lease)
still shows in the report.
"""

from __future__ import annotations

import re
from pathlib import Path

#: name -> pattern; a pattern with a group counts the group's number, else one per line
PATTERNS = {
    "deadlocks": re.compile(r"Deadlock found|deadlock detected"),  # MariaDB | PostgreSQL
    "lock_wait_timeouts": re.compile(r"Lock wait timeout"),
    "receipts_given_up": re.compile(r"ack batch of (\d+) .* given up"),
    "dispatcher_batches_left": re.compile(
        r"dispatcher: (?:transient database error; )?batch of \d+ left for the relay"),
    "busy": re.compile(r"message \S+ busy: "),
    "reconsume_later": re.compile(r"message \S+ reconsume later: "),
    "slow_transport_shutdowns": re.compile(r"shut down in (?:[1-9]\d|\d{3,})\.\d+ s"),
    "tracebacks": re.compile(r"^Traceback \(most recent call last\)"),
    "cli_errors": re.compile(r"^error: "),
    "errors": re.compile(r" ERROR "),
}


def scan(folder: Path) -> dict[str, dict[str, int]]:
    """`{role: {finding: count}}` for every `*.log` in `folder` (only non-zero counts)."""
    out: dict[str, dict[str, int]] = {}
    for path in sorted(folder.glob("*.log")):
        counts: dict[str, int] = {}
        with path.open(errors="replace") as f:
            for line in f:
                for name, pattern in PATTERNS.items():
                    m = pattern.search(line)
                    if m:
                        counts[name] = counts.get(name, 0) + (int(m.group(1)) if m.groups()
                                                              else 1)
        if counts:
            out[path.stem] = counts
    return out


def totals(found: dict[str, dict[str, int]]) -> dict[str, int]:
    """The counts summed over the roles."""
    total: dict[str, int] = {}
    for counts in found.values():
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n
    return total
