"""One module per peer, each run in that peer's own virtual environment (consumer-kit's in the
project's). Each reads a job on stdin and prints one result line: see `bench.peers.harness`."""
