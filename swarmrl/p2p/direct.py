"""Peers in one process, without the network: a serving side that answers as a
:class:`~swarmrl.p2p.host.Host` answers (the sender admitted first, then its request
decoded, handled and the answer encoded, within the specs' size limits), and callers
that reach it directly.

What libp2p adds (framing, Noise, streaming, deadlines) is the host's and its own
tests'; this is for exercising what peers say to each other at the speed of a
function call: intake's tests and the trust benchmark's cheating nodes. A refusal
reaches the caller as the WireError or Refusal the handler raised, where over the
network it would arrive as a RemoteError with the same sentence.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from swarmrl.p2p import wire
from swarmrl.p2p.protocol import (
    Admit,
    RequestResponse,
    Served,
    ServedUpload,
    Upload,
    UploadHandler,
)


def _within(frames: Sequence[bytes], limit: int) -> None:
    for frame in frames:
        if len(frame) > limit:
            raise wire.WireError(f"a {len(frame)}-byte frame is over the {limit}-byte limit")


class DirectServer:
    """The protocols one peer serves (a :class:`~swarmrl.p2p.protocol.Server`)."""

    def __init__(self) -> None:
        self.protocols: dict[str, Served[Any, Any]] = {}
        self.uploads: dict[str, tuple[ServedUpload[Any, Any], Path]] = {}

    def serve(
        self,
        spec: RequestResponse[Any, Any],
        handler: Callable[[str, Any], Any],
        *,
        admit: Admit | None = None,
    ) -> None:
        self.protocols[spec.id] = Served(spec, handler, admit)

    def serve_upload(
        self,
        spec: Upload[Any, Any],
        handler: UploadHandler[Any, Any],
        *,
        spool_dir: Path,
        admit: Admit | None = None,
        max_uploads: int = 8,
    ) -> None:
        """As the host serves it, one upload at a time (in the caller's thread), so
        `max_uploads` bounds nothing here."""
        spool_dir.mkdir(parents=True, exist_ok=True)
        self.uploads[spec.id] = (ServedUpload(spec, handler, admit), spool_dir)

    def answer(self, spec: RequestResponse[Any, Any], peer: str, body: bytes) -> list[bytes]:
        """What this peer answers a request frame `body` of `spec` from `peer`."""
        served = self.protocols[spec.id]
        served.admit_peer(peer)
        return served.answer(peer, body)

    def caller(self, peer_id: str) -> DirectCaller:
        """A peer `peer_id` (as Noise would have authenticated it) that calls this one."""
        return DirectCaller(self, peer_id)


class DirectCaller:
    """A peer calling a :class:`DirectServer` (a :class:`~swarmrl.p2p.protocol.Caller`):
    sizes are checked against the specs' limits, and an upload is checked from its
    header (which may answer it: its body is then never sent) before its body is
    spooled into a new file that the handler then owns."""

    def __init__(self, server: DirectServer, peer_id: str) -> None:
        self.server = server
        self._peer_id = peer_id
        self._uploads = itertools.count()

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def call(self, spec: RequestResponse[Any, Any], peer_id: str, request: Any) -> Any:
        (body,) = spec.request.encode(request)
        _within([body], spec.request_limit)
        frames = self.server.answer(spec, self._peer_id, body)
        _within(frames, spec.response_limit)
        return spec.response.decode(frames)

    def upload(self, spec: Upload[Any, Any], peer_id: str, header: Any, path: Path) -> Any:
        (body,) = spec.header.encode(header)
        _within([body], spec.header_limit)
        if path.stat().st_size > spec.body_limit:
            raise wire.WireError(f"the upload is over its {spec.body_limit}-byte limit")
        served, spool = self.server.uploads[spec.id]
        served.admit_peer(self._peer_id)
        checked, answered = served.check(self._peer_id, body)
        if answered is not None:  # answered from the header alone: no body is sent
            _within(answered, spec.response_limit)
            return spec.response.decode(answered)
        spooled = spool / f"{self._peer_id}-{next(self._uploads)}.upload"
        shutil.copyfile(path, spooled)
        try:
            frames = served.receive(self._peer_id, checked, spooled)
        finally:
            spooled.unlink(missing_ok=True)  # what the handler did not move away
        _within(frames, spec.response_limit)
        return spec.response.decode(frames)
