"""`python -m bench.peers`: the peer benchmark (see bench/peers/README.md)."""

from __future__ import annotations

import sys

from bench.peers.cli import main

argv = sys.argv[1:]
sys.argv[:] = ["-m", "bench.peers", *argv]  # the command line the report prints
sys.exit(main(argv))
