"""What the node's terminal app shows, as plain data: events and chain facts in, text out."""

from __future__ import annotations

import logging

import pytest

from client.node.events import Event, EventKind, describe, log_event
from client.node.screen.onchain import epoch_work
from client.node.screen.view import (
    LAST_REJECTIONS,
    ChainFacts,
    EpochWork,
    NodeView,
    claimable_epochs,
    epoch_status,
    how_to_claim,
    stake_status,
)
from swarmrl.chain.compute_pool import Membership, PartRecord, Settlement, WorkRecord
from swarmrl.chain.recorded_work import LeafRef, WorkLeaf

TOKEN = 10**18
NODE = "0x" + "ab" * 20
PROVIDER = "0x" + "cd" * 20


def facts(**changes: object) -> ChainFacts:
    fields: dict = dict(
        provider=PROVIDER,
        stake=150 * TOKEN,
        needed=100 * TOKEN,
        unbonding=0,
        joined=True,
        now=1_000,
        epochs=(),
    )
    return ChainFacts(**(fields | changes))


@pytest.mark.parametrize(
    ("work", "status"),
    [
        (EpochWork(1), "awaiting record"),
        (EpochWork(1, units=3, unlocks_at=1_000 + 23 * 60), "pending — claimable in 23 min"),
        (EpochWork(1, units=3, unlocks_at=1_000 + 2 * 3600 + 5), "pending — claimable in 2 h 5 s"),
        (EpochWork(1, units=3, unlocks_at=1_000), "claimable"),
        (EpochWork(1, units=3, unlocks_at=900, claimed=True), "claimed"),
        (EpochWork(1, units=3, unlocks_at=2_000, invalidated=True), "invalidated"),
        (EpochWork(1, units=3, unlocks_at=2_000, invalidated=True, slashed=True), "slashed"),
        (
            EpochWork(1, units=3, unlocks_at=900, backed=False),
            "never paid: recorded when the node was not in the pool",
        ),
    ],
)
def test_an_epoch_s_window_reads_by_the_chain_s_clock(work, status):
    assert epoch_status(work, now=1_000) == status


def _record(settlement: Settlement, *, slashed: bool = False, left_at: int = 0) -> WorkRecord:
    """Node NODE's 3 units of epoch 1, recorded at 500 under its membership 1 (joined at 100)."""
    leaf = WorkLeaf(NODE, 1, 3, bytes(32))
    return WorkRecord(
        ref=LeafRef(1, 0, leaf, ()),
        record=PartRecord(bytes(32), 3, 1, 500, 1_100, TOKEN // 10),
        membership=Membership(PROVIDER, 100, left_at, slashed, 50 * TOKEN),
        settlement=settlement,
    )


@pytest.mark.parametrize(
    ("record", "status"),
    [
        (None, "awaiting record"),
        (_record(Settlement.OPEN), "pending — claimable in 1 min 40 s"),
        (_record(Settlement.OPEN, left_at=700), "pending — claimable in 1 min 40 s"),
        (_record(Settlement.CLAIMED), "claimed"),
        (_record(Settlement.INVALIDATED), "invalidated"),
        # Slashed through another epoch: this one's reward is forfeit too, unless paid.
        (_record(Settlement.OPEN, slashed=True, left_at=700), "slashed"),
        # Slashed in the second its part was recorded: the pool reads it as not backed.
        (_record(Settlement.INVALIDATED, slashed=True, left_at=500), "slashed"),
        (_record(Settlement.CLAIMED, slashed=True, left_at=700), "claimed"),
        # Recorded once the node had left (at 500 or before): never paid.
        (
            _record(Settlement.OPEN, left_at=500),
            "never paid: recorded when the node was not in the pool",
        ),
        (
            _record(Settlement.RELEASED, left_at=400),
            "never paid: recorded when the node was not in the pool",
        ),
    ],
)
def test_the_chain_s_record_of_an_epoch_reads_as_the_screen_shows_it(record, status):
    work = epoch_work(1, record)
    assert epoch_status(work, now=1_000) == status
    assert work.final == (status != "awaiting record" and not status.startswith("pending"))


def test_stake_status():
    assert stake_status(facts()) == "ok"
    assert stake_status(facts(unbonding=5 * TOKEN // 2)) == "ok, 2.5 unbonding"
    assert stake_status(facts(stake=99 * TOKEN)) == "below minimum (100 needed)"


def test_rewards_add_up_pending_and_claimable_epochs():
    view = NodeView(NODE)
    view.chain = facts(
        epochs=(
            EpochWork(3, units=4, reward=4 * TOKEN // 10, unlocks_at=900),
            EpochWork(4, units=2, reward=2 * TOKEN // 10, unlocks_at=1_600),
            EpochWork(5, units=1, reward=TOKEN // 10, unlocks_at=800, claimed=True),
            EpochWork(6),
        )
    )
    assert claimable_epochs(view.chain) == [3]
    lines = view.reward_lines()
    assert lines[:2] == ["pending   0.2", "claimable 0.4  (c claims)"]
    assert "epoch 4  2 units, 0.2: pending — claimable in 10 min" in lines
    assert "epoch 5  1 units, 0.1: claimed" in lines
    assert "epoch 6  awaiting record" in lines


def test_how_to_claim_names_the_command():
    assert how_to_claim(NODE, [3, 4]).endswith(
        f"`swarmrl wallet claim <provider key> --node {NODE} --epoch 3 --epoch 4`"
    )


def test_events_update_the_view():
    view = NodeView(NODE)
    for event in (
        Event(EventKind.JOINED, step=1),
        Event(EventKind.WEIGHTS_PROGRESS, step=2, done=3, total=7),
        Event(EventKind.ORDER, step=1, order="abc", total=8),
        Event(
            EventKind.GENERATED,
            step=1,
            rollouts=8,
            tokens_per_second=200.0,
            reward=0.25,
            extra={"tokens": "400"},
        ),
        Event(
            EventKind.GENERATED,
            step=1,
            rollouts=4,
            tokens_per_second=100.0,
            reward=1.0,
            extra={"tokens": "200"},
        ),
        Event(EventKind.WEIGHTS_READY, step=2),
        Event(EventKind.SUBMITTED, digest="d1", units=8),
        Event(EventKind.RESENT, digest="d2", units=0, reason="policy step 0 is stale"),
        Event(EventKind.REFUSED, digest="d5", reason="work order ab is already expired"),
        Event(EventKind.OUTCOME, digest="d1", units=8, extra={"status": "accepted"}),
        Event(EventKind.OUTCOME, digest="d3", units=0, reason="bad", extra={"status": "rejected"}),
        Event(EventKind.OUTCOME, digest="d4", units=0, extra={"status": "received"}),
    ):
        view.apply(event)
    assert (view.step, view.rollouts, view.tokens, view.tokens_per_second) == (1, 12, 600, 100.0)
    assert view.rollouts_per_second == pytest.approx(2.0)
    assert view.download is not None
    assert (view.download.done, view.download.total) == (7, 7)
    assert (view.submitted, view.intake_accepted, view.intake_rejected) == (3, 1, 2)
    assert (view.validated, view.validated_units, view.invalid) == (1, 8, 1)
    # Mean over rollouts, not over orders: (8 * 0.25 + 4 * 1.0) / 12.
    assert view.reward_curve() == ([1], [pytest.approx(0.5)])
    assert view.submission_lines()[-3:] == [
        "✗ d3 validation: bad",
        "✗ d5 refused: work order ab is already expired",
        "✗ d2 intake: policy step 0 is stale",
    ]


def test_only_the_last_rejections_are_kept():
    view = NodeView(NODE)
    for i in range(LAST_REJECTIONS + 2):
        view.apply(Event(EventKind.SUBMITTED, digest=f"d{i}", units=0, reason=f"r{i}"))
    kept = [r.digest for r in view.rejections]
    assert kept == [f"d{i}" for i in range(2, LAST_REJECTIONS + 2)]
    assert view.intake_rejected == LAST_REJECTIONS + 2


def test_the_reason_line_follows_holds_retries_work_and_endings():
    view = NodeView(NODE)
    assert view.state_line() == "not joined yet: joining"
    retry = "orchestrator unreachable: connection refused"
    view.apply(Event(EventKind.RETRY, reason=retry, extra={"wait": "2.0s"}))
    assert view.state_line() == f"{retry} (trying again in 2.0s)"
    assert not view.working
    view.apply(Event(EventKind.JOINED, step=0))
    assert view.state_line() == "working"
    assert view.working
    view.apply(Event(EventKind.NO_WORK, reason="no policy is published yet", extra={"wait": "2s"}))
    assert view.state_line() == "no work offered: no policy is published yet (asking again in 2s)"
    view.apply(Event(EventKind.ORDER, step=0, order="abc", total=8))
    assert view.state_line() == "working"
    view.apply(Event(EventKind.HELD, reason="paused by you"))
    assert view.state_line() == "paused by you: after the order in flight"
    view.apply(Event(EventKind.PAUSED))
    assert view.state_line() == "paused by you"
    view.apply(Event(EventKind.HELD, reason="on battery: work resumes on mains power"))
    assert view.state_line() == "on battery: work resumes on mains power"
    view.apply(Event(EventKind.HELD, reason=""))
    view.apply(Event(EventKind.RESUMED))
    assert view.state_line() == "working"
    view.apply(Event(EventKind.FINISHING))
    assert view.state_line().startswith("finishing: the order in flight")
    view.apply(Event(EventKind.STOPPING))
    assert view.state_line() == "stopping: finishing the order in flight"
    view.apply(Event(EventKind.STOPPED))
    assert view.state_line() == "stopped"


def test_the_log_line_and_the_app_s_line_are_one_text(caplog):
    event = Event(EventKind.SUBMITTED, digest="abc", units=0, reason="late", extra={"wait": "1s"})
    assert describe(event) == "submitted digest=abc units=0 wait=1s reason='late'"
    with caplog.at_level(logging.INFO, logger="swarmrl.node"):
        log_event(event)
        log_event(Event(EventKind.RETRY, reason="gone"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, describe(event)),
        (logging.WARNING, "retry reason='gone'"),
    ]


def test_the_work_panel_says_how_far_behind_the_newest_step_the_node_works():
    view = NodeView(NODE)
    view.apply(Event(EventKind.JOINED, step=3))
    view.apply(Event(EventKind.ORDER, step=3))
    assert "policy step 3" in view.work_lines()
    view.apply(Event(EventKind.WEIGHTS_ANNOUNCED, step=5))
    assert "policy step 3 (2 behind step 5)" in view.work_lines()
    view.apply(Event(EventKind.WEIGHTS_ANNOUNCED, step=4))  # late gossip changes nothing
    assert "policy step 3 (2 behind step 5)" in view.work_lines()
    view.apply(Event(EventKind.GENERATED, step=5, rollouts=1))
    assert "policy step 5" in view.work_lines()
    assert not any(line.startswith("workers") for line in view.work_lines())  # just one
    view.apply(Event(EventKind.WORKERS, total=2))
    assert "workers     2, an order split among them" in view.work_lines()
