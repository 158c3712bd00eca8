"""``/swarmrl/have/1.0.0`` on the wire: the asker's advert in, the peer's advert out;
and when a node asks each peer (the advertiser's PollSchedule)."""

from __future__ import annotations

from swarmrl.shards import DEFAULT_SHARD_SIZE
from swarmrl.weights.advertiser import MAX_POLL_INTERVAL, POLL_INTERVAL, PollSchedule
from swarmrl.weights.gossip import (
    MAX_ADDRS,
    MAX_EXCHANGED_PEERS,
    MAX_HOLDINGS,
    Advert,
    Holding,
)
from swarmrl.weights.have import HAVE, HaveRequest
from swarmrl.weights.peer_records import PeerRecord
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


# ---- when a node swaps adverts with a peer (PollSchedule) ---------------------------------

CHANGED = ADVERT.model_copy(
    update={"holdings": [Holding(manifest_hash=HASH, step=3, shards="ffc0")]}
)


def _polls(schedule, until, advert_at, peer="p", *, heard=None):
    """Ticks every POLL_INTERVAL from 0 to `until`, swapping with `peer` whenever it is
    due; `advert_at(t)`: its advert then; `heard`: {t: advert} it gossips at t. The
    times of the swaps."""
    swaps = []
    for i in range(round(until / POLL_INTERVAL) + 1):
        t = i * POLL_INTERVAL
        if heard and t in heard:
            schedule.heard(peer, heard[t], t)
        if peer in schedule.due([peer], t):
            schedule.swapped(peer, advert_at(t), t)
            swaps.append(t)
    return swaps


def test_a_peer_whose_advert_stays_the_same_is_polled_ever_less_often_up_to_the_cap():
    schedule = PollSchedule()
    assert MAX_POLL_INTERVAL == 30.0
    swaps = _polls(schedule, 130, lambda t: ADVERT)
    assert swaps == [0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 61.5, 91.5, 121.5]
    assert schedule.interval_of("p") == MAX_POLL_INTERVAL


def test_a_poll_that_finds_the_advert_changed_polls_again_after_poll_interval():
    schedule = PollSchedule()
    swaps = _polls(schedule, 40, lambda t: ADVERT if t < 20 else CHANGED)
    # Backed off to 16 s when the change came at 20 s: the poll at 31.5 finds it.
    assert swaps == [0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 32, 33, 35, 39]


def test_a_gossiped_change_brings_the_next_poll_forward_to_poll_interval():
    schedule = PollSchedule()
    # The same advert again (a periodic one, or one signed anew) is nothing new.
    resigned = ADVERT.model_copy(update={"record": RECORD.model_copy(update={"issued_at": 6})})
    heard = {10.0: ADVERT, 12.0: resigned, 20.0: CHANGED}
    swaps = _polls(schedule, 40, lambda t: ADVERT if t < 20 else CHANGED, heard=heard)
    assert swaps == [0, 0.5, 1.5, 3.5, 7.5, 15.5, 20.5, 21.5, 23.5, 27.5, 35.5]


def test_a_failed_swap_teaches_nothing_and_backs_off_too():
    schedule = PollSchedule()
    swaps = _polls(schedule, 8, lambda t: None)  # it never answers
    assert swaps == [0, 0.5, 1.5, 3.5, 7.5]
    schedule.swapped("p", ADVERT, 8.0)  # it answers at last: something new
    assert schedule.interval_of("p") == POLL_INTERVAL
    assert schedule.due(["p"], 8.5) == ["p"]


def test_the_schedule_keeps_only_connected_peers():
    schedule = PollSchedule()
    for peer in ("a", "b"):
        schedule.swapped(peer, ADVERT, 0.0)
    assert schedule.due(["a", "b"], 0.5) == ["a", "b"]
    assert schedule.due(["a"], 0.6) == ["a"]  # b disconnected: forgotten
    assert "b" not in schedule
    assert "a" in schedule
    # Gossip from a peer not connected (or not yet swapped with) adds nobody.
    schedule.heard("c", CHANGED, 1.0)
    assert "c" not in schedule
    # Met again: a new peer, due at once and at POLL_INTERVAL after its first swap.
    assert schedule.due(["a", "b"], 1.0) == ["a", "b"]
    schedule.swapped("b", ADVERT, 1.0)
    assert schedule.interval_of("b") == POLL_INTERVAL


def test_a_download_that_starts_polls_every_peer_afresh():
    schedule = PollSchedule()
    assert _polls(schedule, 20, lambda t: ADVERT)[-1] == 15.5  # backed off to 16 s
    schedule.restart(20.0)
    assert schedule.interval_of("p") == POLL_INTERVAL
    assert schedule.due(["p"], 20.0) == ["p"]
    schedule.swapped("p", ADVERT, 20.0)  # unchanged: 1 s next, not 32 s
    assert schedule.due(["p"], 20.5) == []
    assert schedule.due(["p"], 21.0) == ["p"]


def test_a_peer_part_way_through_a_version_being_fetched_stays_at_poll_interval():
    schedule = PollSchedule()
    swaps = []
    for i in range(21):
        t = i * POLL_INTERVAL
        if "p" in schedule.due(["p"], t):
            schedule.swapped("p", ADVERT, t, fetching=True)  # unchanged, but mid-download
            swaps.append(t)
    assert swaps == [i * POLL_INTERVAL for i in range(21)]
