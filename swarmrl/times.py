"""Times as a person reads them: spans ("9 min 59 s") and moments given as unix times
("2026-11-24 10:09:16 UTC (in 9 min 59 s)"), for chain messages and the node's screen."""

from __future__ import annotations

import re
from datetime import UTC, datetime

# The last second datetime can show (9999-12-31 23:59:59 UTC): later "times" are numbers.
LAST_SHOWN = 253_402_300_799


def duration(seconds: int) -> str:
    """A span of time in its two largest units, e.g. "2 d 3 h", "59 min 30 s"."""
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
    return " ".join(parts[:2])


def date_time(timestamp: int) -> str:
    """A unix time as a UTC date and time, e.g. "2026-11-24 10:09:16 UTC"."""
    if not 0 <= timestamp <= LAST_SHOWN:
        return str(timestamp)
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def moment(timestamp: int, now: int) -> str:
    """A unix time as its date and time and how far it is from `now`."""
    if not 0 <= timestamp <= LAST_SHOWN:
        return str(timestamp)
    if timestamp > now:
        when = f"in {duration(timestamp - now)}"
    elif timestamp < now:
        when = f"{duration(now - timestamp)} ago"
    else:
        when = "now"
    return f"{date_time(timestamp)} ({when})"


_SPAN = re.compile(r"(\d{1,7})(min|d|h|m|s)")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "min": 60, "s": 1}


def parse_duration(text: str) -> int:
    """Seconds in a span as people type it: "90s", "30m", "1h", "2h30m", "1d"; a bare
    number is minutes. ValueError in one sentence otherwise."""
    text = text.strip().lower()
    # Plain ASCII digits, and few: int() would also take other scripts' digits, and a
    # number of thousands of digits is refused by int() in words of its own.
    if re.fullmatch(r"[0-9]{1,7}", text):
        return int(text) * 60
    parts = _SPAN.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration such as 90s, 30m, 1h or 2h30m")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)
