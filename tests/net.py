"""What listens where: TCP listening sockets read from /proc/net/tcp and tcp6."""

from __future__ import annotations

import ipaddress
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listening() -> dict[int, set[str]]:
    """port -> local addresses of the TCP sockets listening on it (IPv4 and IPv6)."""
    found: dict[int, set[str]] = {}
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state != LISTEN:
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            # the kernel prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.setdefault(int(hex_port, 16), set()).add(str(ipaddress.ip_address(words)))
    return found


def loopback_only(addresses: set[str]) -> bool:
    """True when every address is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x)."""
    def loop(text: str) -> bool:
        addr = ipaddress.ip_address(text)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped.is_loopback
        return addr.is_loopback
    return bool(addresses) and all(loop(a) for a in addresses)
