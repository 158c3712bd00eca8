"""``/swarmrl/have/1.0.0`` on the wire: the asker's advert in, the peer's advert out."""

from __future__ import annotations

from swarmrl.p2p.have import HAVE, HaveRequest
from swarmrl.p2p.messages import (
    MAX_ADDRS,
    MAX_EXCHANGED_PEERS,
    MAX_HOLDINGS,
    Advert,
    Holding,
)
from swarmrl.p2p.records import PeerRecord
from swarmrl.shards import DEFAULT_SHARD_SIZE
from tests.codecs import CodecSuite

HASH = "ab" * 32
RECORD = PeerRecord(
    peer_id="12D3KooWGzMQxWqL2tX6UGXtqCuZ9LmW1cXYkpdPmrd1G9P1Lfh4",
    account="0x" + "12" * 20,
    issued_at=5,
    signature="cd" * 65,
)
ADVERT = Advert(
    record=RECORD,
    addrs=["/ip4/127.0.0.1/tcp/4001"],
    data="127.0.0.1:9000",
    holdings=[Holding(manifest_hash=HASH, step=3, shards="ff80")],
)


class TestCodecs(CodecSuite):
    SPEC = HAVE
    ID = "/swarmrl/have/1.0.0"
    EXAMPLES = (HaveRequest(advert=ADVERT), ADVERT)


def test_a_request_may_carry_no_advert():
    assert HAVE.request.decode([b"{}"]) == HaveRequest()


def test_the_limits_hold_an_advert_of_eight_one_tib_checkpoints():
    """Every address and exchanged peer, and the holdings of eight 1 TiB checkpoints in
    64 MiB shards (16,384 shards each). (Eight bitfields of MAX_BITFIELD_HEX would not
    fit: the advert's size, not the bitfield's, bounds what a peer can advertise.)"""
    shards = (1 << 40) // DEFAULT_SHARD_SIZE
    largest = Advert(
        record=RECORD,
        addrs=["/" + "a" * 255] * MAX_ADDRS,
        data="h" * 300,
        holdings=[Holding(manifest_hash=HASH, step=2**53, shards="f" * (shards // 4))]
        * MAX_HOLDINGS,
        peers=["/" + "p" * 255] * MAX_EXCHANGED_PEERS,
    )
    (body,) = HAVE.response.encode(largest)
    assert len(body) <= HAVE.response_limit
    (body,) = HAVE.request.encode(HaveRequest(advert=largest))
    assert len(body) <= HAVE.request_limit


def test_a_poll_gives_up_on_a_slow_peer_before_the_serving_deadline():
    assert HAVE.wait < HAVE.deadline
