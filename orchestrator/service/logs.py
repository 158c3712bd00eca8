"""Where each of the orchestrator's processes logs: stderr and ``<data_dir>/logs/``."""

from __future__ import annotations

from pathlib import Path

from swarmrl.logs import setup_logging


def setup_process_logging(data_dir: Path, name: str, *, stderr: bool = True) -> None:
    setup_logging(Path(data_dir) / "logs" / f"{name}.log", stderr=stderr)
