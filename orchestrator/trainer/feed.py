"""Rollouts into the trainer: a spool directory of files, and the checks before training.

Samplers hand rollouts over as whole parquet files in a spool directory
(``<sampler>-<counter>.parquet``, written atomically, so a file there is complete).
The trainer reads them in the order they were written and takes nothing on
trust: a file it cannot use is skipped, logged once per kind of fault, counted
and deleted, never a crash. Its usable groups wait in a queue; groups sampled
more than ``async_level`` steps ago and groups whose task rewards all agree are
dropped and counted.

A file the trainer has read moves to ``read/``, so a sampler's back-pressure
counts only what is still unread. Nothing is lost or used twice across a crash:
a read file is deleted only after the checkpoint of the step that used up its
last group is written, and that checkpoint's state lists, per read file still on
disk, the groups not yet used (``position``). A restarted trainer restores
exactly those, and puts back any file it had read after its last checkpoint.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.trainer.samples import Group, split_groups, staleness
from swarmrl.rollouts import checks
from swarmrl.rollouts.generate import PromptIds
from swarmrl.rollouts.records import Rollout, read_rollouts, write_rollouts
from swarmrl.tasks import Task

logger = logging.getLogger(__name__)

_FILE = re.compile(r"([a-z0-9]+)-(\d{8})\.parquet")


def spool_name(sampler: str, counter: int) -> str:
    """The file name of a sampler's ``counter``-th batch."""
    if not re.fullmatch(r"[a-z0-9]+", sampler):
        raise ValueError(f"sampler names are lowercase letters and digits, not {sampler!r}")
    return f"{sampler}-{counter:08d}.parquet"


class Spool:
    """A directory where samplers leave rollout files for the trainer."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.read_dir = self.directory / "read"
        self.read_dir.mkdir(parents=True, exist_ok=True)

    def put(self, sampler: str, counter: int, records: list[Rollout]) -> Path:
        path = self.directory / spool_name(sampler, counter)
        write_rollouts(records, path)
        return path

    def files(self) -> list[Path]:
        """Complete unread files, oldest first (hidden files are writes in progress)."""
        return _listed(self.directory)

    def read_files(self) -> list[Path]:
        """Files the trainer has read and not yet used up."""
        return _listed(self.read_dir)

    def mark_read(self, path: Path) -> Path:
        return path.rename(self.read_dir / path.name)

    def put_back(self, path: Path) -> None:
        """A read file whose reading no checkpoint recorded: unread again."""
        path.rename(self.directory / path.name)

    def pending(self, sampler: str) -> int:
        """How many of a sampler's files wait to be read: its back-pressure."""
        return sum(1 for p in self.directory.glob(f"{sampler}-*.parquet"))

    def next_counter(self, sampler: str, used: int = -1) -> int:
        """The counter a restarted sampler continues from: past every file it left and
        past ``used``, the highest the trainer has read."""
        highest = used
        for p in [*self.directory.glob(f"{sampler}-*"), *self.read_dir.glob(f"{sampler}-*")]:
            m = _FILE.fullmatch(p.name)
            if m and m.group(1) == sampler:
                highest = max(highest, int(m.group(2)))
        return highest + 1


@dataclass(frozen=True, kw_only=True)
class Expectations:
    """What a usable rollout must match: this run, its tasks, its sampling settings."""

    run: str
    tasks: dict[str, Task]
    tokenizer: Any
    vocab_size: int
    group_size: int
    temperature: float


@dataclass
class _Queued:
    group: Group
    file: str
    index: int


@dataclass
class Taken:
    """The groups for one step, and what was dropped while gathering them."""

    groups: list[Group]
    stale: int
    filtered: int


class RolloutFeed:
    """Usable groups from a spool, oldest first, with the counts of what was not usable."""

    def __init__(
        self, spool: Spool, expect: Expectations, position: dict[str, list[int]] | None = None
    ) -> None:
        self.spool = spool
        self.expect = expect
        self.queue: deque[_Queued] = deque()
        # Per file read and still on disk: the indices of its groups not yet used.
        self.position: dict[str, list[int]] = {}
        self.counts: Counter[str] = Counter()
        self.highest_counter: dict[str, int] = {}
        self._warned: set[str] = set()
        self._restore(position or {})

    # -- reading ------------------------------------------------------------------

    def poll(self, trainer_step: int) -> int:
        """Read every new file in the spool; return how many groups were queued."""
        queued = 0
        for path in self.spool.files():
            if path.name in self.position:
                continue
            groups = self._usable(path, trainer_step)
            m = _FILE.fullmatch(path.name)
            if m:
                sampler, counter = m.group(1), int(m.group(2))
                self.highest_counter[sampler] = max(self.highest_counter.get(sampler, -1), counter)
            if groups is None:
                path.unlink(missing_ok=True)
                continue
            self.spool.mark_read(path)
            self.position[path.name] = list(range(len(groups)))
            for i, group in enumerate(groups):
                self.queue.append(_Queued(group, path.name, i))
            queued += len(groups)
        return queued

    def take(
        self,
        count: int,
        trainer_step: int,
        async_level: int,
        *,
        wait: Callable[[], bool],
    ) -> Taken | None:
        """``count`` fresh groups that teach something, waiting for samplers as needed;
        None if ``wait`` (called between polls, it sleeps) says to stop."""
        taken: list[Group] = []
        stale = filtered = 0
        while len(taken) < count:
            if not self.queue:
                self.poll(trainer_step)
                if not self.queue and not wait():
                    return None  # what was taken goes back with the uncommitted position
                continue
            item = self.queue.popleft()
            self.position[item.file].remove(item.index)
            if staleness(trainer_step, item.group) > async_level:
                stale += 1
            elif not item.group.teaches():
                filtered += 1
            else:
                taken.append(item.group)
        self.counts["stale_groups"] += stale
        self.counts["filtered_groups"] += filtered
        return Taken(taken, stale, filtered)

    # -- what a checkpoint records --------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The data position, for the checkpoint of the step just taken."""
        return {
            "position": {name: list(left) for name, left in self.position.items()},
            "highest_counter": dict(self.highest_counter),
            "counts": dict(self.counts),
        }

    def release(self) -> None:
        """Delete the files whose groups are all used; call once the checkpoint is written."""
        for name in [n for n, left in self.position.items() if not left]:
            (self.spool.read_dir / name).unlink(missing_ok=True)
            del self.position[name]

    # -- internals ------------------------------------------------------------------

    def _restore(self, position: dict[str, list[int]]) -> None:
        for path in self.spool.read_files():
            if path.name not in position:
                self.spool.put_back(path)
        for name, left in position.items():
            path = self.spool.read_dir / name
            if not path.is_file():
                continue
            if not left:
                path.unlink(missing_ok=True)  # used up before the crash; not yet deleted
                continue
            groups = self._usable(path, trainer_step=None)
            if groups is None:
                path.unlink(missing_ok=True)
                continue
            keep = sorted(i for i in set(left) if 0 <= i < len(groups))
            self.position[name] = keep
            for i in keep:
                self.queue.append(_Queued(groups[i], name, i))

    def _usable(self, path: Path, trainer_step: int | None) -> list[Group] | None:
        """The file's groups, or None (logged once per fault, counted) if it is unusable."""
        try:
            records = read_rollouts(path)
            if not records:
                raise ValueError(f"{path.name} holds no records")
            prompts = PromptIds(self.expect.tokenizer)  # a group's prompt tokenised once
            for record in records:
                self._check(record, trainer_step, prompts)
            return split_groups(records, self.expect.group_size)
        except (ValueError, OSError) as e:
            self.counts["unusable_files"] += 1
            fault = _fault_kind(str(e))
            if fault not in self._warned:
                self._warned.add(fault)
                logger.warning("skipping rollout file %s: %s", path.name, e)
            return None

    def _check(self, r: Rollout, trainer_step: int | None, prompts: PromptIds) -> None:
        """ValueError with the sentence of the first check the record fails."""
        expect = self.expect
        task = expect.tasks.get(r.problem_id)
        why = (
            checks.as_asked("run", r.run, expect.run)
            or (
                None if trainer_step is None else checks.step_published(r.policy_step, trainer_step)
            )
            or checks.known_task(r, expect.tasks)
        )
        if why is None and task is not None:  # a known task, then
            why = (
                checks.same_task(r, task)
                or checks.as_asked("temperature", r.temperature, expect.temperature)
                or checks.vocabulary(r, expect.vocab_size)
                or checks.logprobs_per_token(r)
                or checks.logprobs_bounded(r)
                or checks.prompt(r, prompts(task.prompt, r.target_len))
            )
        if why is not None:
            raise ValueError(why)


def _listed(directory: Path) -> list[Path]:
    found = [p for p in directory.iterdir() if _FILE.fullmatch(p.name)]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _fault_kind(message: str) -> str:
    """A fault's kind for logging it once: its sentence without file names or numbers."""
    return re.sub(r"\S*\.parquet|\d+", "#", message)
