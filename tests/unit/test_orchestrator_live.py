"""The live view of `orchestrator run`: sparklines, a frame rendered from a summary, the
summary read from a real ledger and metrics file, and a view that fails without
taking anything down."""

from __future__ import annotations

import io
import json
import logging
import math

from rich.console import Console

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.nodes import Seen
from orchestrator.service.live import (
    BLOCKS,
    TAIL_BYTES,
    LiveView,
    last_log_lines,
    render,
    sparkline,
)
from orchestrator.service.status import read_status, summarize
from swarmrl.work.assign import Slot, WorkOrder
from tests.unit.test_ledger import NODE, NODE_CHECKSUM, OTHER, OTHER_CHECKSUM, PROVIDER, submission

RUN = "0x" + "77" * 32
TX_EPOCH, TX_SLASH = "0x" + "e1" * 32, "0x" + "5a" * 32


def text_of(renderable, width: int = 120) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


# ---- sparkline ----------------------------------------------------------------------


def test_a_rising_series_climbs_every_block():
    assert sparkline(range(8)) == BLOCKS
    assert sparkline([10.0, 0.0, 5.0]) == "█▁▅"


def test_a_flat_series_is_a_flat_line_and_gaps_are_blanks():
    assert sparkline([3.0, 3.0, 3.0]) == "▄▄▄"
    assert sparkline([1.0, None, math.nan, 2.0, math.inf]) == "▁  █ "
    assert sparkline([None, None]) == "  "
    assert sparkline([]) == ""


# ---- one frame ------------------------------------------------------------------------


def summary(**changes):
    base = {
        "policy_step": 42,
        "task_reward": 0.4123,
        "length": 87.25,
        "staleness": 1.0,
        "samples_per_second": 3.456,
        "last_step_at": 1000.0,
        "recent": {"task_reward": [0.1, 0.2, 0.4], "length": [80.0, 90.0, 87.25]},
        "submissions": {"received": 3, "accepted": 40, "rejected": 2},
        "rollouts_accepted": 320,
        "nodes": [
            {"address": NODE_CHECKSUM, "state": "active", "backend": "vllm", "workers": 8,
             "tokens_per_second": 1234.4, "order_prompts": 16, "order_budget": 512,
             "accepted": 40, "rejected": 1, "units": 320},
            {"address": OTHER_CHECKSUM, "state": "silent", "backend": "torch", "workers": 1,
             "tokens_per_second": None, "order_prompts": None, "order_budget": None,
             "accepted": 0, "rejected": 1, "units": 0},
        ],
        "epochs_recorded": [
            {"epoch": 3, "node": NODE_CHECKSUM, "units": 320, "tx": TX_EPOCH, "at": 10.0},
            {"epoch": 3, "node": OTHER_CHECKSUM, "units": 0, "tx": None, "at": 11.0},
            {"epoch": 2, "node": NODE_CHECKSUM, "units": 8, "tx": None, "at": 5.0},
        ],
        "slashes": [
            {"epoch": 3, "node": OTHER_CHECKSUM, "tx": TX_SLASH, "outcome": "sent", "at": 12.0}
        ],
    }  # fmt: skip
    return {**base, **changes}


def test_a_frame_shows_the_step_rate_nodes_queue_and_transactions():
    logged = "2025-01-01T12:00:01.000Z INFO swarmrl.orchestrator a log line"
    text = text_of(render(summary(), run=RUN, now=1007.0, log_lines=[logged]))
    assert f"run {RUN[:10]}" in text
    assert "policy step 42" in text
    assert "samples/s 3.46" in text
    assert "last step 7 s ago" in text
    assert "validation queue 3" in text
    assert "▁▃█ 0.412" in text.replace("  ", " ")
    node_rows = [line for line in text.splitlines() if NODE_CHECKSUM[:6] in line]
    assert any("active" in r and "vllm x8" in r and "1234" in r and "320" in r for r in node_rows)
    assert any("16x512" in r for r in node_rows)  # its newest order: 16 prompts, budget 512
    assert any(OTHER_CHECKSUM[:6] in line and "silent" in line for line in text.splitlines())
    chain = [line for line in text.splitlines() if " tx " in line]
    # Newest last; the epoch without work sent nothing and is not a transaction.
    assert len(chain) == 3
    assert "epoch    2" in chain[0]
    assert "found on chain" in chain[0]
    assert "epoch    3" in chain[1]
    assert TX_EPOCH[:10] in chain[1]
    assert "slash    3" in chain[2]
    assert f"sent  tx {TX_SLASH[:10]}" in chain[2]
    assert "12:00:01.000Z INFO swarmrl.orchestrator a log line" in text
    assert "2025-01-01" not in text
    assert "stopping" not in text


def test_a_frame_before_the_first_step_and_while_stopping():
    empty = summary(
        policy_step=0,
        task_reward=None,
        length=None,
        samples_per_second=None,
        last_step_at=None,
        recent={"task_reward": [], "length": []},
        submissions={},
        rollouts_accepted=0,
        nodes=[],
        epochs_recorded=[],
        slashes=[],
    )
    text = text_of(render(empty, run=RUN, now=0.0, stopping=True))
    assert "policy step 0" in text
    assert "samples/s -" in text
    assert "last step -" in text
    assert "validation queue 0" in text
    assert "no node has joined yet" in text
    assert "on chain: 0 transactions" in text
    assert "stopping" in text


# ---- the summary from the data dir ---------------------------------------------------


def data_dir_with_a_run(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.nodes.join(NODE, PROVIDER, "peer-a", "vllm", {"workers": 8}, now=1.0)
    ledger.nodes.join(OTHER, PROVIDER, "peer-b", "torch", {}, now=2.0)
    ledger.nodes.set_state(NODE, "active", "heartbeat", now=3.0)
    ledger.nodes.touch({NODE: Seen(at=3.0, speed=250.0)})
    for counter, prompts in ((0, 4), (1, 8)):  # the newest order is the one shown
        ledger.orders.add(f"{counter:064x}", sized_order(counter, prompts), 3.0)
    for n in range(4):
        ledger.submissions.record(submission(n, node=NODE if n < 3 else OTHER))
    ledger.submissions.set_outcome(submission(0).digest, "accepted", 8, "", False, True, now=4.0)
    ledger.submissions.set_outcome(submission(1).digest, "accepted", 8, "", False, False, now=4.0)
    ledger.submissions.set_outcome(submission(3).digest, "rejected", 0, "bad", True, True, now=4.0)
    ledger.epochs.record(0, NODE, 16, "0x" + "00" * 32, TX_EPOCH, now=5.0)
    ledger.slashes.record(submission(3).digest, 0, OTHER, TX_SLASH, now=6.0)
    ledger.close()
    run = RunDir.of_orchestrator(tmp_path)
    run.root.mkdir()
    rows = [
        {"step": 1, "task_reward": 0.25, "length": 40.0, "staleness_mean": 0.0},  # an old row
        *(
            {"step": s, "task_reward": 0.25 * s, "length": 40.0 + s, "staleness_mean": 1.0,
             "time": 100.0 + 10 * s, "samples": 16}
            for s in range(2, 9)
        ),
    ]  # fmt: skip
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    run.metrics.write_text(lines + '{"step": 9, "task_')  # a line cut short
    return tmp_path


def sized_order(counter: int, prompts: int) -> WorkOrder:
    return WorkOrder(
        run="0x" + "5a" * 32,
        node=NODE,
        counter=counter,
        min_step=0,
        seed=1,
        group_size=8,
        max_tokens=128,
        temperature=1.0,
        top_p=1.0,
        tasks=[Slot(problem_id=f"p{i}", budget=128) for i in range(prompts)],
        deadline=100,
        signature="22" * 65,
    )


def test_the_summary_reads_the_ledger_and_the_metrics(tmp_path):
    data_dir = data_dir_with_a_run(tmp_path)
    with Ledger(data_dir / "ledger.sqlite3") as ledger:
        s = summarize(ledger, RunDir.of_orchestrator(data_dir))
    assert s["policy_step"] == 8
    assert s["samples_per_second"] == 16 / 10  # five steps, each 16 samples in 10 s
    assert s["last_step_at"] == 180.0
    assert s["recent"]["task_reward"] == [0.25 * k for k in range(1, 9)]
    assert s["recent"]["length"][0] == 40.0
    assert s["submissions"] == {"received": 1, "accepted": 2, "rejected": 1}
    assert s["rollouts_accepted"] == 16
    by_node = {n["address"]: n for n in s["nodes"]}
    assert (by_node[NODE_CHECKSUM]["state"], by_node[NODE_CHECKSUM]["tokens_per_second"]) == (
        "active",
        250.0,
    )
    assert [(n["order_prompts"], n["order_budget"]) for n in s["nodes"]] == [(8, 128), (None, None)]
    # One node of eight workers; one that joined before nodes said, one.
    assert [n["workers"] for n in s["nodes"]] == [8, 1]
    assert [(n["accepted"], n["rejected"], n["units"]) for n in s["nodes"]] == [
        (2, 0, 16),
        (0, 1, 0),
    ]
    assert s["epochs_recorded"] == [
        {"epoch": 0, "node": NODE_CHECKSUM, "units": 16, "tx": TX_EPOCH, "at": 5.0}
    ]
    assert s["slashes"] == [
        {"node": OTHER_CHECKSUM, "epoch": 0, "tx": TX_SLASH, "outcome": "sent", "at": 6.0}
    ]
    # `orchestrator status` reads the same summary, so the two cannot disagree.
    assert read_status(data_dir) == s


# ---- log lines -------------------------------------------------------------------------


def test_the_last_log_lines_of_every_process_in_time_order(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "orchestrator.log").write_text(
        "2025-01-01T00:00:01.000Z INFO a one\n2025-01-01T00:00:04.000Z INFO a four\n"
    )
    (logs / "trainer.log").write_text(
        "2025-01-01T00:00:02.000Z INFO t two\n2025-01-01T00:00:03.000Z INFO t three\n"
    )
    (logs / "unrelated.log").write_text("2025-01-01T00:00:09.000Z INFO not ours\n")
    assert [line.split()[-1] for line in last_log_lines(logs, 3)] == ["two", "three", "four"]
    # A long log is read from its end only, without the line the cut went through.
    filler = "2025-01-01T00:00:00.000Z INFO v " + "x" * 100 + "\n"
    (logs / "validator.log").write_text(filler * (2 * TAIL_BYTES // len(filler)))
    assert all(line.startswith("2025-") for line in last_log_lines(logs, 1000))


def test_no_logs_yet_is_no_lines(tmp_path):
    assert last_log_lines(tmp_path / "logs", 5) == []


# ---- the view's thread ----------------------------------------------------------------


def test_the_view_draws_until_stopped(tmp_path):
    data_dir = data_dir_with_a_run(tmp_path)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=100)
    view = LiveView(data_dir, RUN, lambda: True, console)
    view.start()
    view.stop()  # draws the last frame, at least, before it returns
    text = out.getvalue()
    assert "policy step 8" in text
    assert "stopping" in text


def test_a_failing_view_logs_once_and_leaves_the_daemon_be(tmp_path, caplog):
    (tmp_path / "ledger.sqlite3").mkdir()  # a ledger the view cannot open
    out = io.StringIO()
    view = LiveView(tmp_path, RUN, lambda: False, Console(file=out, width=100))
    with caplog.at_level(logging.ERROR):
        view.start()
        view.stop()
    failures = [r for r in caplog.records if "live view failed" in r.getMessage()]
    assert len(failures) == 1
    assert "the orchestrator goes on" in out.getvalue()
