"""Dial-back: how a peer learns that others can reach its data endpoint.

Most volunteers sit behind NAT: their data server listens, but nobody outside
can connect to it. A peer that advertised such an endpoint would send every
downloader into timeouts. So a peer offers its shards only after another peer
has dialled it back: it arms its data server with a fresh nonce, asks a peer
over libp2p to probe its port, and believes the answer only if its own server
saw that nonce arrive (the reply itself proves nothing).

The dialling side probes only the IP address the request's connection comes
from, never an address the asker names, so no peer can aim it at a third
party; and it dials each asker at most once per MIN_GAP seconds.

The protocol, ``/swarmrl/dialback/1.0.0``, is :data:`DIALBACK`:

    request = {"port": u16, "nonce": 32 bytes hex}
    reply   = {"reached": bool, "endpoint": "host:port" dialled, or null}
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict

from pydantic import Field

from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.protocol import Json, RequestResponse
from swarmrl.schema import Hex32, Strict
from swarmrl.weights.datapath import NONCE_BYTES, Endpoint, ShardServer, probe

log = logging.getLogger("swarmrl.p2p")

PROBE_TIMEOUT = 5.0
MIN_GAP = 10.0
_REMEMBERED_ASKERS = 4096


class DialbackRequest(Strict):
    """Asks a peer to probe the asker's data port, at the address it connects from."""

    port: int = Field(ge=1, le=65535)
    nonce: Hex32


class DialbackReply(Strict):
    reached: bool
    endpoint: str | None = Field(default=None, max_length=300)  # host:port dialled


DIALBACK = RequestResponse(
    wire.protocol_id("dialback"),
    Json(DialbackRequest),
    Json(DialbackReply),
    request_limit=256,
    response_limit=512,
    deadline=PROBE_TIMEOUT * 2,
    # The asker waits past the serving side's deadline: probing takes up to that long,
    # and the reply must still reach it.
    call_timeout=PROBE_TIMEOUT * 3,
)


class DialbackService:
    """The dialling side: the request handler of :data:`DIALBACK`."""

    def __init__(self, host: Host, *, min_gap: float = MIN_GAP) -> None:
        self._host = host
        self._min_gap = min_gap
        self._last: OrderedDict[str, float] = OrderedDict()  # peer -> when dialled
        self._lock = threading.Lock()

    def __call__(self, peer: str, request: DialbackRequest) -> DialbackReply:
        self._check_gap(peer)
        hosts = sorted(self._host.remote_hosts(peer))
        if not hosts:
            raise wire.Refusal("no open connection to dial back along")
        nonce = bytes.fromhex(request.nonce)
        for host in hosts:
            endpoint = Endpoint(host, request.port)
            if probe(endpoint, nonce, timeout=PROBE_TIMEOUT):
                return DialbackReply(reached=True, endpoint=str(endpoint))
        return DialbackReply(reached=False)

    def _check_gap(self, peer: str) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(peer)
            if last is not None and now - last < self._min_gap:
                raise wire.Refusal(f"one dial-back per {self._min_gap:.0f} s, please")
            self._last[peer] = now
            self._last.move_to_end(peer)
            while len(self._last) > _REMEMBERED_ASKERS:
                self._last.popitem(last=False)


def ask(host: Host, server: ShardServer, peer: str) -> Endpoint | None:
    """Asks `peer` to dial `server` back: the endpoint it reached (as the peer saw
    it), or None if the probe did not arrive at `server`."""
    nonce = os.urandom(NONCE_BYTES)
    arrived = server.expect_probe(nonce)
    request = DialbackRequest(port=server.endpoint.port, nonce=nonce.hex())
    try:
        reply = host.call(DIALBACK, peer, request)
    except (RemoteError, wire.WireError, ConnectionError, TimeoutError, RuntimeError) as e:
        log.debug("dial-back by %s failed: %s", peer, e)
        return None
    finally:
        server.forget_probe(nonce)
    if not arrived.is_set():
        return None
    try:
        return Endpoint.parse(reply.endpoint) if reply.endpoint else server.endpoint
    except ValueError:
        return server.endpoint
