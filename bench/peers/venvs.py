"""One virtual environment per peer, from the package index with exact pins, cached under
~/.cache/consumer-kit/peers/<peer>-<hash of Python version and pins> (a second run reuses it)."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.peers.catalog import Peer

CACHE = Path(os.environ.get("CKIT_PEERS_CACHE",
                            Path.home() / ".cache" / "consumer-kit" / "peers"))
INSTALL_TIMEOUT = 600.0


def venv_dir(peer: Peer) -> Path:
    """Where the peer's environment lives (the name changes when a pin changes)."""
    key = "\n".join([platform.python_version(), *peer.requirements])
    return CACHE / f"{peer.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def python_for(peer: Peer) -> str:
    """The interpreter a peer's runner uses (the project's own for consumer-kit)."""
    if not peer.requirements:
        return sys.executable
    return str(venv_dir(peer) / "bin" / "python")


def ensure(peer: Peer, log: list[str]) -> str:
    """Create and fill the peer's environment unless the cached one is complete; returns its
    interpreter. Fails with one line naming the pip command that failed."""
    if not peer.requirements:
        return sys.executable
    target = venv_dir(peer)
    ready = target / ".ready"
    if ready.exists():
        log.append(f"{peer.name}: cached environment {target}")
        return python_for(peer)
    started = time.monotonic()
    if target.exists():
        shutil.rmtree(target)  # a half-made environment from an interrupted run
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True,
                   timeout=INSTALL_TIMEOUT)
    pip = [python_for(peer), "-m", "pip", "install", "--disable-pip-version-check", "-q",
           *peer.requirements]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        raise SystemExit(f"{peer.name}: `{' '.join(pip[2:])}` failed: {tail[0]}")
    freeze = subprocess.run([python_for(peer), "-m", "pip", "freeze"], capture_output=True,
                            text=True, timeout=120, check=True).stdout
    (target / "freeze.txt").write_text(freeze)
    ready.write_text("\n".join(peer.requirements) + "\n")
    log.append(f"{peer.name}: installed {' '.join(peer.requirements)} in "
               f"{time.monotonic() - started:.0f} s ({target})")
    return python_for(peer)
