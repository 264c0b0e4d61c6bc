"""Name-server host names resolved in Python, before the native client sees them.

librocketmq (the C++ core of rocketmq-client-python) resolves a name-server host name on its
own timer threads, and a name that does not resolve makes one of them throw
`rocketmq::MQClientException` where nothing catches it: the C++ runtime calls `terminate` and
the whole process aborts (SIGABRT, exit 134), a relay with rows claimed included. So the native
client is only ever given addresses: `resolved` turns each `host:port` into `ip:port` first,
and a name that does not resolve is an error Python can handle (a refusal at `check`, an
outage at start). A host's address is looked up again at each start of a native client (a
consumer the watchdog rebuilds looks again), not followed while it runs: a name server whose
address changes under its name is found again by a restart of the producing process.
"""

from __future__ import annotations

import ipaddress
import socket

from consumer_kit.core.errors import ConfigError, TransportUnavailable

#: getaddrinfo answers that say the name does not exist (a typo), not that DNS is away
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def resolved(addr: str) -> str:
    """`addr` (`host:port;host:port`, as `wire.parse_addr` returns it) with every host name
    replaced by its first IPv4 address (IPv6 when it has none); addresses are kept as given.

    Raises:
        ConfigError: a host name that does not exist.
        TransportUnavailable: the resolver did not answer (try again later).
    """
    out = []
    for entry in addr.split(";"):
        host, _, port = entry.rpartition(":")
        found = _address(host.strip("[]"), int(port))
        out.append(f"[{found}]:{port}" if ":" in found else f"{found}:{port}")  # IPv6 bracketed
    return ";".join(out)


def for_native(addr: str) -> str:
    """`resolved(addr)` for a native client being started: a name that does not resolve is an
    outage here (`check` refused a misspelt one before anything ran; one gone since may come
    back, and the caller waits an outage out).

    Raises:
        TransportUnavailable: a host name that does not resolve now.
    """
    try:
        return resolved(addr)
    except ConfigError as exc:
        raise TransportUnavailable(str(exc)) from None


def _address(host: str, port: int) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_NAME:
            raise ConfigError(f"RocketMQ name server host {host!r} does not resolve ({exc}): "
                              "check rocketmq://host:port") from None
        raise TransportUnavailable(f"RocketMQ name server host {host!r} could not be "
                                   f"resolved now ({exc})") from None
    ipv4 = [info[4][0] for info in found if info[0] == socket.AF_INET]
    return str(ipv4[0] if ipv4 else found[0][4][0])
