"""What `orchestrator status` and `orchestrator ledger` show, read from the data dir.

Both read the ledger and the trainer's metrics file without taking part in the
run: they work while the daemon runs (SQLite's WAL lets readers in) and after
it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.service.ledger import Ledger
from orchestrator.train_local.metrics import read_metrics

RUN_DIR = "run"


def _ledger(data_dir: Path) -> Ledger:
    path = data_dir / "ledger.sqlite3"
    if not path.is_file():
        raise ValueError(f"{data_dir} holds no orchestrator ledger; has it run yet?")
    return Ledger(path)


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
                "received_at": s.received_at,
            }
            for s in ledger.submissions()
        ]
    finally:
        ledger.close()


def read_status(data_dir: Path) -> dict[str, Any]:
    ledger = _ledger(data_dir)
    try:
        tally = ledger.tally()
        nodes = []
        for n in ledger.nodes():
            accepted = tally.per_node.get((n.address, "accepted"), (0, 0))
            rejected = tally.per_node.get((n.address, "rejected"), (0, 0))
            nodes.append(
                {
                    "address": n.address,
                    "state": n.state,
                    "backend": n.backend,
                    "tokens_per_second": n.speed,
                    "accepted": accepted[0],
                    "rejected": rejected[0],
                    "units": accepted[1],
                }
            )
        epochs = [
            {"epoch": e.epoch, "node": e.node, "units": e.units, "tx": e.tx_hash}
            for e in ledger.recorded_epochs()
        ]
        slashes = [{"node": s.node, "epoch": s.epoch, "tx": s.tx_hash} for s in ledger.slashes()]
    finally:
        ledger.close()
    rows = read_metrics(data_dir / RUN_DIR / "metrics.jsonl")
    last = rows[-1] if rows else {}
    return {
        "policy_step": last.get("step", 0),
        "task_reward": last.get("task_reward"),
        "length": last.get("length"),
        "staleness": last.get("staleness_mean"),
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
        f"{'node':<44} {'state':<8} {'tok/s':>7} {'acc':>5} {'rej':>5} {'units':>6}",
    ]
    for n in summary["nodes"]:
        speed = n["tokens_per_second"]
        lines.append(
            f"{n['address']:<44} {n['state']:<8} {'-' if speed is None else f'{speed:.0f}':>7} "
            f"{n['accepted']:>5} {n['rejected']:>5} {n['units']:>6}"
        )
    lines.append("")
    lines.append(f"epochs recorded on chain: {len(summary['epochs_recorded'])}")
    for s in summary["slashes"]:
        lines.append(f"slashed {s['node']} for epoch {s['epoch']}: {s['tx']}")
    return "\n".join(lines)
