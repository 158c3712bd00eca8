"""The trainer's intake: usable groups in order, everything else skipped and counted,
stale and uninformative groups dropped, and nothing lost or used twice across a restart."""

from __future__ import annotations

import itertools
import logging

import pyarrow.parquet as pq
import pytest

from orchestrator.tasks.generators import demo_tasks
from orchestrator.trainer.feed import Expectations, RolloutFeed, Spool
from orchestrator.trainer.samples import split_groups
from swarmrl.models.backend import SamplingParams
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.records import read_rollouts

GROUP = 4
NODE = "0x" + "11" * 20
TASKS = demo_tasks(8, seed=3)


def _alternating():
    """A reward that differs within every group: 0, 1, 0, 1, ... in sampling order."""
    turns = itertools.cycle([0.0, 1.0])
    return lambda task, text: next(turns)


def _records(backend, tasks, *, step=0, run="r", seed=0, temperature=1.0, score=None):
    return generate_rollouts(
        backend,
        tasks,
        n=GROUP,
        params=SamplingParams(max_tokens=6, temperature=temperature),
        provenance=Provenance(run=run, policy_step=step, node=NODE),
        seed=seed,
        score=score or _alternating(),
        target_for=lambda _: 16,
    )


@pytest.fixture
def spool(tmp_path):
    return Spool(tmp_path / "spool")


@pytest.fixture
def expect(backend):
    return Expectations(
        run="r",
        tasks={t.problem_id: t for t in TASKS},
        tokenizer=backend.tokenizer,
        vocab_size=backend.model.config.vocab_size,
        group_size=GROUP,
        temperature=1.0,
    )


def _never_wait() -> bool:
    return False


def _teaching(records) -> int:
    return sum(g.teaches() for g in split_groups(records, GROUP))


def test_groups_come_in_order_and_files_go_once_used_up(backend, spool, expect):
    first = _records(backend, TASKS[:3])
    spool.put("w0", 0, first)
    spool.put("w0", 1, _records(backend, TASKS[3:5], seed=1))
    feed = RolloutFeed(spool, expect)
    assert feed.poll(trainer_step=0) == 5
    wanted = _teaching(first)
    assert wanted == 3
    taken = feed.take(wanted, 0, async_level=2, wait=_never_wait)
    assert taken is not None
    assert len(taken.groups) == wanted
    assert taken.groups[0].problem_id in {t.problem_id for t in TASKS[:3]}
    assert [len(g.records) for g in taken.groups] == [GROUP] * wanted
    feed.state()
    feed.release()
    # Every group of the first file is used (trained or filtered): it is gone. The
    # second is read, so it no longer holds its sampler back, but not used up.
    assert spool.files() == []
    assert [p.name for p in spool.read_files()] == ["w0-00000001.parquet"]
    assert spool.pending("w0") == 0


def test_stale_groups_and_groups_that_all_agree_are_dropped_and_counted(backend, spool, expect):
    spool.put("w0", 0, _records(backend, TASKS[:2], step=0))
    spool.put("w0", 1, _records(backend, TASKS[2:4], step=3, score=lambda t, s: 1.0))
    spool.put("w0", 2, _records(backend, TASKS[4:6], step=3))
    feed = RolloutFeed(spool, expect)
    taken = feed.take(1, trainer_step=3, async_level=2, wait=_never_wait)
    assert taken is not None
    assert taken.stale == 2  # step 0 is 3 steps behind: more than async level 2
    assert taken.filtered == 2  # task rewards all 1.0: nothing to learn
    assert taken.groups[0].policy_step == 3
    assert feed.counts["stale_groups"] == 2
    assert feed.counts["filtered_groups"] == 2


def test_take_gives_up_when_told_and_the_uncommitted_position_is_not_kept(backend, spool, expect):
    spool.put("w0", 0, _records(backend, TASKS[:1]))
    feed = RolloutFeed(spool, expect)
    assert feed.take(50, 0, 2, wait=_never_wait) is None
    # Nothing was committed: a restart from the empty position reads the file afresh.
    again = RolloutFeed(spool, expect, position={})
    assert again.poll(0) == 1


def _tamper(path, column, value):
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0][column] = value
    pq.write_table(type(table).from_pylist(rows, schema=table.schema), path)


UNUSABLE = {
    "altered": lambda b, spool: _tamper(
        spool.put("w0", 0, _records(b, TASKS[:1])), "task_reward", 1.0 - 1e-9
    ),
    "another run": lambda b, spool: spool.put("w0", 0, _records(b, TASKS[:1], run="other")),
    "unknown step": lambda b, spool: spool.put("w0", 0, _records(b, TASKS[:1], step=9)),
    "unknown task": lambda b, spool: spool.put("w0", 0, _records(b, demo_tasks(1, seed=99))),
    "temperature": lambda b, spool: spool.put("w0", 0, _records(b, TASKS[:1], temperature=0.5)),
    "cut group": lambda b, spool: spool.put("w0", 0, _records(b, TASKS[:1])[:3]),
}


@pytest.mark.parametrize("fault", sorted(UNUSABLE))
def test_an_unusable_file_is_skipped_counted_and_removed(backend, spool, expect, fault, caplog):
    UNUSABLE[fault](backend, spool)
    spool.put("w0", 1, _records(backend, TASKS[2:4], seed=5))
    feed = RolloutFeed(spool, expect)
    with caplog.at_level(logging.WARNING, logger="orchestrator.trainer.feed"):
        assert feed.poll(trainer_step=0) == 2
    assert feed.counts["unusable_files"] == 1
    assert spool.files() == []
    assert [p.name for p in spool.read_files()] == ["w0-00000001.parquet"]
    assert "skipping rollout file w0-00000000.parquet" in caplog.text


def test_a_fault_is_logged_once_however_often_it_recurs(backend, spool, expect, caplog):
    for counter in range(3):
        spool.put("w0", counter, _records(backend, TASKS[:1], run="other", seed=counter))
    with caplog.at_level(logging.WARNING, logger="orchestrator.trainer.feed"):
        RolloutFeed(spool, expect).poll(0)
    assert caplog.text.count("its run is other") == 1


def test_prompts_made_for_another_budget_are_refused(backend, spool, expect):
    records = _records(backend, TASKS[:1])
    forged = [r.model_copy(update={"target_len": 99}).sealed() for r in records]
    spool.put("w0", 0, forged)
    feed = RolloutFeed(spool, expect)
    assert feed.poll(0) == 0
    assert feed.counts["unusable_files"] == 1


def test_a_restart_restores_exactly_the_groups_not_yet_used(backend, spool, expect):
    records = _records(backend, TASKS[:6])
    spool.put("w0", 0, records)
    spool.put("w0", 1, _records(backend, TASKS[6:8], seed=1))
    feed = RolloutFeed(spool, expect)
    feed.poll(0)
    feed.queue.popleft()  # a step's worth: the first two groups of file 0
    feed.position["w0-00000000.parquet"].remove(0)
    feed.queue.popleft()
    feed.position["w0-00000000.parquet"].remove(1)
    state = feed.state()
    left = [(q.file, q.index) for q in feed.queue]

    # The crash: a new feed from the checkpoint's state, the same files on disk.
    restored = RolloutFeed(spool, expect, position=state["position"])
    assert [(q.file, q.index) for q in restored.queue] == left
    assert restored.poll(0) == 0  # no file is read twice
    assert state["highest_counter"] == {"w0": 1}
    assert spool.next_counter("w0", state["highest_counter"]["w0"]) == 2


def test_a_used_up_file_left_by_a_crash_is_removed_on_restart(backend, spool, expect):
    spool.mark_read(spool.put("w0", 0, _records(backend, TASKS[:1])))
    RolloutFeed(spool, expect, position={"w0-00000000.parquet": []})
    assert spool.files() == spool.read_files() == []


def test_a_file_read_after_the_last_checkpoint_is_read_again(backend, spool, expect):
    spool.put("w0", 0, _records(backend, TASKS[:2]))
    RolloutFeed(spool, expect).poll(0)  # read, then the crash: no checkpoint recorded it
    assert spool.files() == []
    restored = RolloutFeed(spool, expect, position={})
    assert restored.poll(0) == 2


def test_sampler_names_are_plain(spool):
    with pytest.raises(ValueError, match="lowercase"):
        spool.put("../x", 0, [])
    assert read_rollouts  # the reader the feed relies on is the one nodes' files go through
