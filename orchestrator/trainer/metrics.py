"""A run's metrics: one JSON line per step in ``metrics.jsonl``, and their curves as a PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_core import from_json

from swarmrl.files import replacing

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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


def samples_per_second(rows: list[dict[str, Any]]) -> list[float]:
    """Each step's samples over the wall time since the step before; NaN where a row
    (one written before rows carried ``time`` and ``samples``) cannot say."""
    rates = [math.nan] * len(rows)
    for i in range(1, len(rows)):
        before, row = rows[i - 1], rows[i]
        if {"time", "samples"} <= row.keys() and "time" in before:
            span = row["time"] - before["time"]
            rates[i] = row["samples"] / span if span > 0 else math.nan
    return rates


def recent_samples_per_second(rows: list[dict[str, Any]], steps: int) -> float | None:
    """Samples per second over the last ``steps`` steps (fewer if that is all there is),
    None until two rows carry a time."""
    timed = [row for row in rows[-(steps + 1) :] if {"time", "samples"} <= row.keys()]
    if len(timed) < 2 or timed[-1]["time"] <= timed[0]["time"]:
        return None
    samples: float = sum(row["samples"] for row in timed[1:])
    span: float = timed[-1]["time"] - timed[0]["time"]
    return samples / span


# The first row is what the issue asked to see at a glance; the second, why it looks so.
_PANELS = (
    ("task reward of the groups trained on", ("task_reward",)),
    ("completion length (tokens)", ("length",)),
    ("throughput (samples per second)", ("samples_per_second",)),
    ("staleness (policy steps)", ("staleness_mean", "staleness_max")),
    ("clip fraction / gradient norm", ("clip_fraction", "grad_norm")),
    ("groups per step", ("kept_groups", "filtered_groups", "stale_groups")),
    ("seconds per step", ("seconds_waiting", "seconds_training", "seconds_generating")),
    ("loss / sampler-trainer mismatch (KL per token)", ("loss", "mismatch_kl")),
)


def metrics_figure(rows: list[dict[str, Any]], title: str) -> Figure:
    """The run's curves against the step, one panel per concern."""
    from matplotlib.figure import Figure

    # A Figure without pyplot: no global registry to leak figures into in a long-lived
    # process, no GUI backend, and safe to draw in a thread. Fixed margins rather than
    # a layout engine, which would double the time a drawing takes.
    fig = Figure(figsize=(17, 6.5))
    axes = fig.subplots(2, 4)
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.08, top=0.9, wspace=0.25, hspace=0.4)
    steps = [row["step"] for row in rows]
    columns = {"samples_per_second": samples_per_second(rows)}
    for ax, (name, keys) in zip(axes.flat, _PANELS, strict=True):
        for key in keys:
            values = columns[key] if key in columns else [row.get(key, math.nan) for row in rows]
            ax.plot(steps, values, label=key, linewidth=1.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def plot_metrics(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """The curves of ``metrics_figure`` as a PNG, replacing ``out`` whole."""
    fig = metrics_figure(rows, title)
    with replacing(Path(out)) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
