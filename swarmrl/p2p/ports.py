"""One process per listen port, said in one sentence when the port is taken.

py-libp2p opens its TCP listeners with SO_REUSEPORT (for hole punching, which
swarmrl does not use), so a second process of the same user binding the same
port succeeds and the kernel splits the connections between the two; and when
the bind fails it logs the failure and carries on listening nowhere. So every
process that listens checks the port itself: before anything starts
(`check_free`: a plain bind, which any listener on the port refuses), and once its
host listens (`check_sole_listener`: the kernel's table of listening sockets holds
no other on that port, in case two processes passed the first check at once).
"""

from __future__ import annotations

import errno
import socket
import struct
from pathlib import Path

import multiaddr

from swarmrl.files import os_error_reason

# The kernel's tables of TCP sockets (Linux), and the state code of a listener.
_TCP_TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}
_LISTEN_STATE = "0A"


class ListenError(OSError):
    """A listen address cannot be used; ``str(e)`` is one sentence for the user."""


def tcp_endpoint(listen: str) -> tuple[socket.AddressFamily, str, int]:
    """(family, ip, port) of a listen multiaddr like /ip4/127.0.0.1/tcp/4001."""
    address = multiaddr.Multiaddr(listen)
    if address.protocols()[0].name == "ip6":
        family, ip = socket.AF_INET6, address.value_for_protocol("ip6")
    else:
        family, ip = socket.AF_INET, address.value_for_protocol("ip4")
    return family, str(ip), int(address.value_for_protocol("tcp"))


def _in_use(listen: str, port: int) -> ListenError:
    _, ip, _ = tcp_endpoint(listen)
    return ListenError(
        f"cannot listen on {listen}: another process already listens on port {port} of {ip}; "
        "choose another port (0: any free one), or stop that process"
    )


def check_free(listen: str) -> None:
    """Raises ListenError if nothing could listen on `listen` now (port 0 always can)."""
    family, ip, port = tcp_endpoint(listen)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # SO_REUSEADDR: the closed connections of an earlier run (TIME_WAIT) do not
            # hold the port; without SO_REUSEPORT, any listener on it does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((ip, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise _in_use(listen, port) from None
        raise ListenError(f"cannot listen on {listen}: {os_error_reason(e)}") from None


def check_sole_listener(listen: str, port: int) -> None:
    """Raises ListenError if another socket listens on `port` (this process's host, bound
    from `listen`, listens there) on an address that overlaps this one's. Where the
    kernel has no such table (not Linux), `check_free` alone stands."""
    family, ip, _ = tcp_endpoint(listen)
    tables = [t for t in _TCP_TABLES.values() if t.is_file()]
    if not tables:
        return
    mine = socket.inet_pton(family, ip)
    overlapping = 0
    for table in tables:
        for other, other_port in _listeners(table):
            if other_port == port and _overlap(mine, other):
                overlapping += 1
    if overlapping > 1:
        raise _in_use(listen, port)


def _listeners(table: Path) -> list[tuple[bytes, int]]:
    """(packed address, port) of each listening socket in a /proc/net/tcp* table."""
    found = []
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != _LISTEN_STATE:
            continue
        address, port = fields[1].split(":")
        # The address is printed as 32-bit words in the machine's byte order.
        words = [int(address[i : i + 8], 16) for i in range(0, len(address), 8)]
        found.append((struct.pack(f"={len(words)}I", *words), int(port, 16)))
    return found


def _overlap(a: bytes, b: bytes) -> bool:
    """Whether listeners on packed addresses `a` and `b` take connections to one address."""
    a, b = _as_ipv4(a), _as_ipv4(b)
    return a == b or any(_is_wildcard(x) for x in (a, b))


def _as_ipv4(packed: bytes) -> bytes:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if len(packed) == 16 and packed[:12] == b"\0" * 10 + b"\xff\xff":
        return packed[12:]
    return packed


def _is_wildcard(packed: bytes) -> bool:
    return not any(packed)
