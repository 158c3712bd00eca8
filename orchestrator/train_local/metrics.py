"""A run's metrics: one JSON line per step in ``metrics.jsonl``, and their curves as a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic_core import from_json

from swarmrl.files import replacing


class MetricsLog:
    """Appends one line per step. A resumed run first drops the lines of steps after its
    checkpoint (written before a crash, for a step that the restart does again)."""

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = Path(path)
        kept = [row for row in read_metrics(self.path) if row.get("step", 0) <= resume_step]
        with replacing(self.path) as tmp:
            tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))

    def append(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a metrics file (a line cut short by a crash is skipped)."""
    if not Path(path).is_file():
        return []
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = from_json(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


_PANELS = (
    ("task reward of the groups trained on", ("task_reward",)),
    ("completion length (tokens)", ("length",)),
    ("staleness (policy steps)", ("staleness_mean", "staleness_max")),
    ("clip fraction / gradient norm", ("clip_fraction", "grad_norm")),
    ("groups per step", ("kept_groups", "filtered_groups", "stale_groups")),
    ("seconds per step", ("seconds_waiting", "seconds_training", "seconds_generating")),
)


def plot_metrics(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """The run's curves against the step, one panel per concern."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
    steps = [row["step"] for row in rows]
    for ax, (name, keys) in zip(axes.flat, _PANELS, strict=True):
        for key in keys:
            values = [row.get(key, float("nan")) for row in rows]
            ax.plot(steps, values, label=key, linewidth=1.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    with replacing(Path(out)) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
