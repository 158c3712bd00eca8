"""``/swarmrl/manifest/1.0.0``: a checkpoint's manifest with its announcement, asked
for by manifest hash or as the newest the peer knows.

A node told of a checkpoint fetches its manifest this way (from the announcing
peer first, then any other), and a node that joins late learns from its
bootstrap peer what to fetch. The reply is two frames: the signed announcement
as JSON, then the manifest in its canonical bytes, the ones its hash names, so
a manifest of several MiB is never re-encoded inside another message. A peer
that holds no such checkpoint refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarmrl.p2p import wire
from swarmrl.p2p.protocol import Codec, Json, RequestResponse
from swarmrl.schema import Hex32, Strict
from swarmrl.shards import MAX_MANIFEST_BYTES, Manifest
from swarmrl.weights.gossip import MAX_ANNOUNCEMENT_BYTES
from swarmrl.weights.peer_records import Announcement


class ManifestRequest(Strict):
    """Asks for one manifest by hash, or for the newest one the peer knows (None)."""

    manifest_hash: Hex32 | None = None


@dataclass(frozen=True)
class ManifestReply:
    announcement: Announcement
    manifest: Manifest


class _ReplyFrames(Codec[ManifestReply]):
    """The announcement's frame, then the manifest's canonical bytes."""

    frames = 2

    def encode(self, message: ManifestReply) -> list[bytes]:
        return [wire.dump(message.announcement), message.manifest.to_json()]

    def decode(self, frames: Sequence[bytes]) -> ManifestReply:
        announcement, manifest = frames
        parsed = wire.parse(Announcement, announcement)
        try:
            return ManifestReply(parsed, Manifest.from_json(manifest))
        except ValueError as e:
            raise wire.WireError(str(e)) from None


MANIFEST = RequestResponse(
    wire.protocol_id("manifest"),
    Json(ManifestRequest),
    _ReplyFrames(),
    request_limit=1024,
    response_limit=MAX_MANIFEST_BYTES + MAX_ANNOUNCEMENT_BYTES,
    deadline=10.0,
)
