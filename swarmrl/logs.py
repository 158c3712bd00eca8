"""Log lines for daemons: one line per event, UTC timestamps, to stderr and a file.

A daemon runs for days and is read by people and by log shippers alike, so a
line is ``<time> <level> <logger> <message>`` and never spans lines.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
MAX_SAID = 300  # the most of an error's text one line carries


def one_line(error: BaseException, said: str | None = None) -> str:
    """`error` as one bounded line: the first line of `said` (what to say of it instead,
    as a sentence naming an RPC failure) or of its text, else its type's name."""
    lines = (said or str(error)).splitlines()
    return lines[0][:MAX_SAID] if lines else type(error).__name__


class UtcFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + (
            f".{int(record.msecs):03d}Z"
        )

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", " | ")


def setup_logging(
    file: Path | None = None, *, level: int = logging.INFO, stderr: bool = True
) -> None:
    """Send swarmrl's log lines to stderr (unless a terminal app owns the screen) and, if
    given, appended to ``file``."""
    from swarmrl.p2p.host import quiet_libp2p_logs

    formatter = UtcFormatter(FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler()] if stderr else []
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file))
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    quiet_libp2p_logs()
