"""What the whole-loop demo shows at the end: a summary for people, ``report.json`` for
programs and ``reward.png`` for the README.

Everything here is read back from what the swarm left behind (the orchestrator's
status and metrics, the daemons' log lines, the chain), so the report states what
happened, not what the demo meant to happen.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from swarmrl.files import replacing


@dataclass
class NodeReport:
    name: str
    address: str
    provider: str
    honest: bool
    accepted: int = 0
    rejected: int = 0
    units: int = 0
    last_rejection: str = ""
    stake_before: float = 0.0
    stake_after: float = 0.0
    claimed: float = 0.0
    claim_refused: str = ""


@dataclass
class Report:
    steps: int = 0
    seconds: float = 0.0
    held_out_before: float | None = None
    # (policy step, held-out reward) for every checkpoint evaluated, oldest first.
    held_out: list[tuple[int, float]] = field(default_factory=list)
    rise: float = 0.0
    nodes: list[NodeReport] = field(default_factory=list)
    slash_tx: str | None = None
    broadcast_seconds: dict[int, float] = field(default_factory=dict)
    processes_left: list[str] = field(default_factory=list)

    @property
    def held_out_after(self) -> float | None:
        return self.held_out[-1][1] if self.held_out else None

    @property
    def rose(self) -> bool:
        before, after = self.held_out_before, self.held_out_after
        return before is not None and after is not None and after >= before + self.rise

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["held_out"] = [{"step": s, "reward": r} for s, r in self.held_out]
        out["held_out_after"] = self.held_out_after
        out["rose"] = self.rose
        out["broadcast_seconds"] = {str(k): v for k, v in self.broadcast_seconds.items()}
        return out

    def write(self, out_dir: Path) -> Path:
        path = out_dir / "report.json"
        with replacing(path) as tmp:
            tmp.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        return path


def summary(report: Report) -> str:
    """The lines the demo ends with."""
    before, after = report.held_out_before, report.held_out_after
    at = report.held_out[-1][0] if report.held_out else 0
    verdict = "rose" if report.rose else f"did not rise by {report.rise}"
    lines = [
        f"{report.steps} policy steps in {report.seconds / 60:.1f} min",
        f"held-out reward (swarmrl eval, fixed seed): {_fmt(before)} before, {_fmt(after)} "
        f"at step {at}: {verdict}",
        "",
        f"{'node':<8} {'':<8} {'accepted':>8} {'rejected':>8} {'stake before':>13} "
        f"{'after':>7} {'claimed':>8}",
    ]
    for n in report.nodes:
        kind = "honest" if n.honest else "cheater"
        lines.append(
            f"{n.name:<8} {kind:<8} {n.accepted:>8} {n.rejected:>8} {n.stake_before:>13.1f} "
            f"{n.stake_after:>7.1f} {n.claimed:>8.2f}"
        )
    for n in report.nodes:
        if not n.honest and n.last_rejection:
            lines.append(f"{n.name} rejected: {n.last_rejection}")
        if n.claim_refused:
            lines.append(f"{n.name}'s provider claimed its epochs: refused ({n.claim_refused})")
    lines.append(f"slashing transaction: {report.slash_tx or 'none'}")
    if report.broadcast_seconds:
        times = list(report.broadcast_seconds.values())
        lines.append(
            f"weights broadcast to every honest node: median {statistics.median(times):.1f} s, "
            f"slowest {max(times):.1f} s over {len(times)} steps"
        )
    lines.append(
        "every process exited"
        if not report.processes_left
        else f"did not exit when stopped: {', '.join(report.processes_left)}"
    )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# -- broadcast times, from the daemons' log lines ------------------------------------

_STAMP = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z"
_PUBLISHED = re.compile(_STAMP + r" \S+ \S+ published policy step (\d+) ")
_READY = re.compile(_STAMP + r" \S+ \S+ weights_ready step=(\d+)")


def _times(lines: Iterable[str], pattern: re.Pattern[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in lines:
        m = pattern.match(line)
        if m:
            when = datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
            out.setdefault(int(m.group(2)), when)
    return out


def broadcast_seconds(orchestrator_log: Path, node_logs: list[Path]) -> dict[int, float]:
    """For each step every node received, seconds from publication until the last of
    them held it (steps a node skipped for a newer one are left out)."""
    published = _times(_read_lines(orchestrator_log), _PUBLISHED)
    ready = [_times(_read_lines(log), _READY) for log in node_logs]
    out = {}
    for step, at in sorted(published.items()):
        arrivals = [r[step] for r in ready if step in r]
        if ready and len(arrivals) == len(ready):
            out[step] = round(max(arrivals) - at, 3)
    return out


def _read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.is_file() else []


# -- the picture ----------------------------------------------------------------------


def plot_reward(report: Report, metrics: list[dict[str, Any]], out: Path) -> None:
    """Held-out reward at each evaluated checkpoint over the training reward's curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    steps = [row["step"] for row in metrics]
    ax.plot(
        steps,
        [row.get("task_reward", float("nan")) for row in metrics],
        color="0.7",
        linewidth=1,
        label="training reward of the groups trained on",
    )
    held = [(0, report.held_out_before)] if report.held_out_before is not None else []
    held += report.held_out
    if held:
        ax.plot(
            [s for s, _ in held],
            [r for _, r in held],
            marker="o",
            color="tab:blue",
            linewidth=2,
            label="held-out reward (swarmrl eval, fixed seed)",
        )
    ax.set_xlabel("policy step")
    ax.set_ylabel("mean task reward")
    ax.set_title("swarmrl demo: three volunteers and a cheater train a policy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    with replacing(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
