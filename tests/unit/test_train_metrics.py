"""The run's metrics: throughput from the rows' wall-clock times, and the PNG's panels."""

from __future__ import annotations

import math

import pytest

from orchestrator.trainer.metrics import (
    metrics_figure,
    plot_metrics,
    recent_samples_per_second,
    samples_per_second,
)

# Row 2 was written by a swarmrl that did not record time and samples yet.
ROWS = [
    {"step": 1, "task_reward": 0.1, "length": 50.0, "staleness_mean": 0.0, "time": 100.0,
     "samples": 8},
    {"step": 2, "task_reward": 0.2, "length": 60.0, "staleness_mean": 1.0},
    {"step": 3, "task_reward": 0.3, "length": 55.0, "staleness_mean": 1.0, "time": 110.0,
     "samples": 16},
    {"step": 4, "task_reward": 0.4, "length": 52.0, "staleness_mean": 2.0, "time": 114.0,
     "samples": 8},
    {"step": 5, "task_reward": 0.5, "length": 51.0, "staleness_mean": 1.5, "time": 118.0,
     "samples": 16},
]  # fmt: skip


def _same(a: list[float], b: list[float]) -> bool:
    pairs = zip(a, b, strict=True)
    return all((math.isnan(x) and math.isnan(y)) or x == pytest.approx(y) for x, y in pairs)


def test_each_steps_rate_is_its_samples_over_the_time_since_the_step_before():
    rates = samples_per_second(ROWS)
    assert len(rates) == len(ROWS)
    # The first has no step before it; rows without a time leave gaps on both sides.
    assert _same(rates, [math.nan, math.nan, math.nan, 8 / 4, 16 / 4])


def test_the_recent_rate_spans_the_last_steps_with_a_time():
    assert recent_samples_per_second(ROWS, 2) == pytest.approx((8 + 16) / 8)
    # Five steps back reaches past the untimed row to the first: 40 samples in 18 s.
    assert recent_samples_per_second(ROWS, 5) == pytest.approx((16 + 8 + 16) / 18)
    assert recent_samples_per_second(ROWS[:2], 5) is None
    assert recent_samples_per_second([], 5) is None


def test_the_figure_has_reward_length_throughput_and_staleness_panels():
    fig = metrics_figure(ROWS, "a run")
    panels = {ax.get_title(): ax for ax in fig.axes}
    for title in (
        "task reward of the groups trained on",
        "completion length (tokens)",
        "throughput (samples per second)",
        "staleness (policy steps)",
    ):
        assert title in panels
    (line,) = panels["throughput (samples per second)"].get_lines()
    assert list(line.get_xdata()) == [1, 2, 3, 4, 5]
    assert _same(list(line.get_ydata()), samples_per_second(ROWS))
    (reward,) = panels["task reward of the groups trained on"].get_lines()
    assert list(reward.get_ydata()) == [0.1, 0.2, 0.3, 0.4, 0.5]


def test_the_plot_is_a_png_that_replaces_the_old_one(tmp_path):
    out = tmp_path / "metrics.png"
    out.write_text("an older plot")
    plot_metrics(ROWS, out, "a run")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.png"]
