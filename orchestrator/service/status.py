"""What `orchestrator status` and `orchestrator ledger` show, read from the data dir.

Both read the ledger and the trainer's metrics file without taking part in the
run: they work while the daemon runs (SQLite's WAL lets readers in) and after
it stopped. The live view of `orchestrator run` shows the same summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.home import ledger_path
from orchestrator.trainer.metrics import read_metrics, recent_samples_per_second
from swarmrl.work.states import SubmissionStatus

RECENT_STEPS = 60  # the curves' length: about what a terminal line holds
RATE_STEPS = 5  # samples per second are over this many steps: steady, yet current


def _ledger(data_dir: Path) -> Ledger:
    path = ledger_path(data_dir)
    if not path.is_file():
        raise ValueError(f"{data_dir} holds no orchestrator ledger; has it run yet?")
    return Ledger(path, create=False)


def ledger_rows(data_dir: Path) -> list[dict[str, Any]]:
    ledger = _ledger(data_dir)
    try:
        return [
            {
                "digest": s.digest,
                "node": s.node,
                "epoch": s.epoch,
                "step": s.step,
                "status": s.status,
                "units": s.units,
                "reason": s.reason,
                "slashable": s.slashable,
                "prefilled": s.prefilled,
                "late": s.late,
                "received_at": s.received_at,
            }
            for s in ledger.submissions.all()
        ]
    finally:
        ledger.close()


def read_status(data_dir: Path) -> dict[str, Any]:
    ledger = _ledger(data_dir)
    try:
        return summarize(ledger, RunDir.of_orchestrator(data_dir))
    finally:
        ledger.close()


def summarize(ledger: Ledger, run: RunDir) -> dict[str, Any]:
    """The run as `orchestrator status --json` shows it, from an open ledger (the live view
    keeps one open rather than open the file every second)."""
    tally = ledger.submissions.tally()
    sizes = ledger.orders.latest_sizes()
    nodes = []
    for n in ledger.nodes.all():
        accepted = tally.per_node.get((n.address, SubmissionStatus.ACCEPTED), (0, 0))
        rejected = tally.per_node.get((n.address, SubmissionStatus.REJECTED), (0, 0))
        prompts, budget = sizes.get(n.address, (None, None))
        nodes.append(
            {
                "address": n.address,
                "state": n.state,
                "backend": n.backend,
                # One node, one key and stake, with a worker per GPU group (the report's).
                "workers": int(n.hardware.get("workers", 1)),
                "tokens_per_second": n.speed,
                "order_prompts": prompts,  # its newest order's size: follows its speed
                "order_budget": budget,
                "accepted": accepted[0],
                "rejected": rejected[0],
                "units": accepted[1],
            }
        )
    epochs = [
        {"epoch": e.epoch, "node": e.node, "units": e.units, "tx": e.tx_hash, "at": e.recorded_at}
        for e in ledger.epochs.all()
    ]
    slashes = [
        {"node": s.node, "epoch": s.epoch, "tx": s.tx_hash, "outcome": s.outcome, "at": s.at}
        for s in ledger.slashes.all()
    ]
    rows = read_metrics(run.metrics)
    last = rows[-1] if rows else {}
    recent = rows[-RECENT_STEPS:]
    return {
        "policy_step": last.get("step", 0),
        "task_reward": last.get("task_reward"),
        "length": last.get("length"),
        "staleness": last.get("staleness_mean"),
        "samples_per_second": recent_samples_per_second(rows, RATE_STEPS),
        "last_step_at": last.get("time"),
        "recent": {key: [row.get(key) for row in recent] for key in ("task_reward", "length")},
        "submissions": {status: n for status, (n, _) in tally.by_status.items()},
        "rollouts_accepted": tally.units(),
        "nodes": nodes,
        "epochs_recorded": epochs,
        "slashes": slashes,
    }


def render_status(summary: dict[str, Any]) -> str:
    reward = summary["task_reward"]
    lines = [
        f"policy step {summary['policy_step']}   task reward "
        f"{'-' if reward is None else f'{reward:.3f}'}   rollouts accepted "
        f"{summary['rollouts_accepted']}",
        "submissions: "
        + (", ".join(f"{k} {v}" for k, v in sorted(summary["submissions"].items())) or "none"),
        "",
        f"{'node':<44} {'state':<8} {'wkr':>3} {'tok/s':>7} {'order':>9} {'acc':>5} {'rej':>5} "
        f"{'units':>6}",
    ]
    for n in summary["nodes"]:
        speed = n["tokens_per_second"]
        order = order_cell(n)
        lines.append(
            f"{n['address']:<44} {n['state']:<8} {n['workers']:>3} "
            f"{'-' if speed is None else f'{speed:.0f}':>7} "
            f"{order:>9} {n['accepted']:>5} {n['rejected']:>5} {n['units']:>6}"
        )
    lines.append("")
    lines.append(f"epochs recorded on chain: {len(summary['epochs_recorded'])}")
    for s in summary["slashes"]:
        lines.append(f"slashed {s['node']} for epoch {s['epoch']}: {s['tx']}")
    return "\n".join(lines)


def order_cell(node: dict[str, Any]) -> str:
    """A node's newest order's size as the tables show it: prompts x thinking budget."""
    if node["order_prompts"] is None:
        return "-"
    return f"{node['order_prompts']}x{node['order_budget']}"
