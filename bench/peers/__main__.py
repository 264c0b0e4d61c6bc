"""`python -m bench.peers`: the peer benchmark (see bench/peers/README.md)."""

from __future__ import annotations

import sys

from bench.peers.cli import main

sys.argv[0] = "-m bench.peers"  # the command line the report prints
sys.exit(main())
