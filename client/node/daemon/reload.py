"""node.toml read again while the daemon runs: limits and when to run change without a
restart; anything else waits for the next start, and the log says which keys.

The file is looked at every second (its size and modification time: a stat, not a
read), so an edit takes effect without a signal or a command. A half-written file must
never change what the node does, whether its editor writes atomically or not: a change
is read only once the file has stood still from one look to the next, and a file that
no longer loads, or no longer sets a key it set (cut short, or emptied), is one warning
and the daemon keeps the settings it has. A key is set back to its default by writing
its default, or at the next start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from client.node.settings import LIVE_KEYS, NodeSettings
from swarmrl.settings_toml import load_settings

log = logging.getLogger("swarmrl.node")

Stamp = tuple[int, int] | None  # (mtime in ns, size); None: no file to look at


class SettingsFile:
    def __init__(self, path: Path | None, current: NodeSettings) -> None:
        self.path = path
        self.current = current
        self._named = current.file_keys  # what the file set when it last loaded
        self._seen = self._stamp()  # the file as last read
        self._moving: Stamp = self._seen  # the file at the last look

    def _stamp(self) -> Stamp:
        if self.path is None:
            return None
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def changed(self) -> NodeSettings | None:
        """The settings to run with now, if the file changed since last read and has
        stood still since the last look, else None. Keys that need a restart keep their
        running values."""
        stamp, last = self._stamp(), self._moving
        self._moving = stamp
        if self.path is None or stamp == self._seen or stamp != last:
            return None
        self._seen = stamp
        try:
            read = load_settings(NodeSettings, self.path)
        except (ValueError, OSError) as e:
            log.warning("%s changed but does not load, so nothing changes: %s", self.path, e)
            return None
        if dropped := sorted(self._named - read.file_keys):
            log.warning(
                "%s changed but no longer sets %s (cut short?), so nothing changes; to "
                "set a key back to its default, write the default",
                self.path,
                ", ".join(dropped),
            )
            return None
        self._named = read.file_keys
        waiting = restart_keys(self.current, read)
        if waiting:
            log.warning(
                "%s changed %s: that takes effect at the next start",
                self.path,
                ", ".join(waiting),
            )
        live = self.current.model_copy(update={k: getattr(read, k) for k in LIVE_KEYS})
        if live == self.current:
            return None
        changed = [k for k in sorted(LIVE_KEYS) if getattr(live, k) != getattr(self.current, k)]
        log.info("%s changed %s: applied", self.path, ", ".join(changed))
        self.current = live
        return live


def restart_keys(old: NodeSettings, new: NodeSettings) -> list[str]:
    """The keys that differ and take effect only at a start."""
    return [
        k
        for k in type(old).model_fields
        if k not in LIVE_KEYS and getattr(old, k) != getattr(new, k)
    ]
