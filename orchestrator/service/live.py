"""The live view of `swarmrl orchestrator run` on a terminal.

It shows what `orchestrator status` shows, from the same reader (``summarize``),
redrawn every second: the recent reward and length as sparklines, the nodes, the
validation queue, the last transactions on chain and the last log lines of the
daemon's processes (which log to their files only while the view owns the screen).
It runs in a thread of the daemon, only reads the data dir, and a failure in it
ends the view, never the daemon.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.home import ledger_path
from orchestrator.service.status import order_cell, summarize
from swarmrl.work.states import NodeState, SubmissionStatus

log = logging.getLogger("swarmrl.orchestrator")

BLOCKS = "▁▂▃▄▅▆▇█"
REFRESH_SECONDS = 1.0
STOP_SECONDS = 10.0
CHAIN_ROWS = 5
LOG_LINES = 8
LOG_FILES = ("orchestrator", "trainer", "validator", "recorder")
TAIL_BYTES = 8192  # enough for the last few lines of a log; never the whole file
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}T")


def sparkline(values: Sequence[float | None]) -> str:
    """One block per value between the series' lowest and highest; a blank for a gap."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    low, high = (min(known), max(known)) if known else (0.0, 0.0)
    top = len(BLOCKS) - 1
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
        elif high == low:  # a flat series: mid-height, so it reads as flat, not as zero
            out.append(BLOCKS[top // 2])
        else:
            out.append(BLOCKS[round((v - low) / (high - low) * top)])
    return "".join(out)


def last_log_lines(logs_dir: Path, n: int) -> list[str]:
    """The newest ``n`` lines of the daemon's log files, oldest first. Lines start with
    their UTC time, so sorting the text merges the files in time order."""
    lines: list[str] = []
    for name in LOG_FILES:
        path = logs_dir / f"{name}.log"
        if not path.is_file():
            continue
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode(errors="replace").splitlines()
        lines += tail[1:] if size > TAIL_BYTES else tail  # the first may be cut
    return sorted(lines)[-n:]


def render(
    summary: dict[str, Any],
    *,
    run: str,
    now: float,
    log_lines: Sequence[str] = (),
    stopping: bool = False,
) -> RenderableType:
    """One frame of the view from a `summarize` dict."""
    rate = summary.get("samples_per_second")
    last_at = summary.get("last_step_at")
    queue = summary["submissions"].get(SubmissionStatus.RECEIVED, 0)
    head = Text.assemble(
        ("policy step ", "dim"),
        (str(summary["policy_step"]), "bold"),
        ("   samples/s ", "dim"),
        "-" if rate is None else f"{rate:.2f}",
        ("   last step ", "dim"),
        "-" if last_at is None else f"{max(0.0, now - last_at):.0f} s ago",
        ("   rollouts accepted ", "dim"),
        str(summary["rollouts_accepted"]),
        ("   validation queue ", "dim"),
        str(queue),
    )
    recent = summary.get("recent", {})
    curves = Table.grid(padding=(0, 2))
    for key, label, digits in (("task_reward", "task reward", 3), ("length", "length", 1)):
        value = summary.get(key)
        curves.add_row(
            label,
            Text(sparkline(recent.get(key, [])), style="cyan"),
            "-" if value is None else f"{value:.{digits}f}",
        )
    parts: list[RenderableType] = [head, curves, _nodes(summary["nodes"])]
    parts.append(_chain(summary["epochs_recorded"], summary["slashes"]))
    if log_lines:
        # Without the date: the view is about the last minutes, and the width is short.
        lines = [_DATE.sub("", line, count=1) for line in log_lines]
        parts.append(Text("\n".join(lines), style="dim", no_wrap=True, overflow="ellipsis"))
    title = f"swarmrl orchestrator · run {run[:10]}" + (" · stopping…" if stopping else "")
    return Panel(Group(*parts), title=title, title_align="left")


def _nodes(nodes: list[dict[str, Any]]) -> RenderableType:
    table = Table(box=None, pad_edge=False, header_style="dim")
    table.add_column("node")
    table.add_column("state")
    table.add_column("backend")
    for name in ("tok/s", "order", "accepted", "rejected", "units"):
        table.add_column(name, justify="right")
    for n in nodes:
        speed = n["tokens_per_second"]
        table.add_row(
            _short(n["address"]),
            Text(n["state"], style=_STATE_STYLES.get(n["state"], "")),
            n["backend"] + (f" x{n['workers']}" if n["workers"] > 1 else ""),
            "-" if speed is None else f"{speed:.0f}",
            order_cell(n),
            str(n["accepted"]),
            str(n["rejected"]),
            str(n["units"]),
        )
    if not nodes:
        table.add_row("no node has joined yet")
    return table


_STATE_STYLES = {
    NodeState.ACTIVE: "green",
    NodeState.SILENT: "yellow",
    NodeState.GONE: "dim",
    NodeState.BANNED: "red",
}


def _chain(epochs: list[dict[str, Any]], slashes: list[dict[str, Any]]) -> RenderableType:
    """The last transactions: epochs with work on chain and slashing votes, newest last."""
    rows = [
        (e["at"], f"epoch {e['epoch']:>4}  {_short(e['node'])}  {e['units']} units", e["tx"])
        for e in epochs
        if e["units"] > 0  # an epoch without work sent nothing
    ]
    rows += [
        (s["at"], f"slash {s['epoch']:>4}  {_short(s['node'])}  {s['outcome']}", s["tx"])
        for s in slashes
    ]
    lines = Text(f"on chain: {len(rows)} transactions\n", style="dim")
    for _, what, tx in sorted(rows, key=lambda r: r[0])[-CHAIN_ROWS:]:
        lines.append(f"{what}  tx {'found on chain' if tx is None else _short(tx, 10)}\n")
    lines.rstrip()
    return lines


def _short(hex_string: str, keep: int = 6) -> str:
    return hex_string if len(hex_string) <= keep + 5 else f"{hex_string[:keep]}…{hex_string[-4:]}"


class LiveView:
    """The view, redrawn in a thread from ``start`` until ``stop``."""

    def __init__(
        self,
        data_dir: Path,
        run: str,
        stopping: Callable[[], bool],
        console: Console | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.run = run
        self.stopping = stopping
        self.console = console or Console()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._show, name="live-view", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Draws the last frame and gives the terminal back."""
        self._done.set()
        # Bounded: a terminal that stopped reading (Ctrl-S) must not keep the daemon alive.
        self._thread.join(timeout=STOP_SECONDS)

    def _frame(self, ledger: Ledger) -> RenderableType:
        return render(
            summarize(ledger, RunDir.of_orchestrator(self.data_dir)),
            run=self.run,
            now=time.time(),
            log_lines=last_log_lines(self.data_dir / "logs", LOG_LINES),
            stopping=self.stopping(),
        )

    def _show(self) -> None:
        try:
            with (
                Ledger(ledger_path(self.data_dir), create=False) as ledger,
                Live(console=self.console, auto_refresh=False) as live,
            ):
                while True:
                    live.update(self._frame(ledger), refresh=True)
                    if self._done.wait(REFRESH_SECONDS):
                        live.update(self._frame(ledger), refresh=True)
                        return
        except Exception:  # the daemon matters more than its picture: carry on without it
            log.exception("the live view failed; the orchestrator goes on without it")
            self.console.print(
                "the live view failed (see logs/orchestrator.log); the orchestrator goes on"
            )
