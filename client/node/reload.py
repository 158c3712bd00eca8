"""node.toml read again while the daemon runs: limits and when to run change without a
restart; anything else waits for the next start, and the log says which keys.

The file is looked at every few seconds (its size and modification time: a stat,
not a read), so an edit takes effect without a signal or a command. A file that no
longer loads is one warning, and the daemon keeps the settings it has.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from client.node.settings import LIVE_KEYS, NodeSettings
from swarmrl.settings_toml import load_settings

log = logging.getLogger("swarmrl.node")


class SettingsFile:
    def __init__(self, path: Path | None, current: NodeSettings) -> None:
        self.path = path
        self.current = current
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def changed(self) -> NodeSettings | None:
        """The settings to run with now, if the file changed since last looked at, else
        None. Keys that need a restart keep their running values."""
        stamp = self._stamp()
        if self.path is None or stamp == self._seen:
            return None
        self._seen = stamp
        try:
            read = load_settings(NodeSettings, self.path)
        except (ValueError, OSError) as e:
            log.warning("%s changed but does not load, so nothing changes: %s", self.path, e)
            return None
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
