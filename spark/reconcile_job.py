"""spark-submit entry of the reconciler: the `ckit reconcile` options, Spark's master from
spark-submit unless `--master` is given.

    spark-submit --jars "$(scripts/jdbc.sh jars)" spark/reconcile_job.py \\
        --url mysql+pymysql://app:pw@db/orders --group inventory=mysql+pymysql://...

This script is an entry point, like `ckit`: it is the one place of `spark/` that uses the CLI.
The Spark source itself is `spark/source.py`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run `ckit reconcile` with `argv` (default: the command line); return the exit code."""
    from consumer_kit.cli.reconcile import standalone

    return standalone(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
