"""What the node's terminal app shows, as plain data: a :class:`NodeView` follows the
node's events and the chain's facts, and renders them as lines of text the widgets
display (client.node.screen.app), so all of it is testable without a terminal.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from client.node.events import Event, EventKind
from swarmrl.chain.tokens import format_tokens
from swarmrl.times import duration
from swarmrl.work.states import SubmissionStatus

LAST_REJECTIONS = 5
EPOCHS_SHOWN = 6
PENDING = "pending"
WORKING = "working"
CLAIMABLE = "claimable"


@dataclass(frozen=True)
class EpochWork:
    """The node's work of one epoch as the chain records it (units 0: not recorded yet)."""

    epoch: int
    units: int = 0
    reward: int = 0
    unlocks_at: int = 0
    claimed: bool = False
    invalidated: bool = False  # slashing invalidates too
    slashed: bool = False  # its membership was slashed: what it had not been paid is forfeit
    # False: recorded under a membership that was not live then (the node had left), so
    # it is never paid (nor slashed).
    backed: bool = True

    @property
    def final(self) -> bool:
        """Nothing can change it any more, so it need not be read again."""
        return self.claimed or self.invalidated or not self.backed


@dataclass(frozen=True)
class ChainFacts:
    """The node's standing on chain, read every few seconds off the UI thread."""

    provider: str
    stake: int
    needed: int  # the provider's nodes times the minimum stake per node
    unbonding: int
    joined: bool
    now: int  # the chain's clock: windows end by it, not by this machine's
    epochs: tuple[EpochWork, ...] = ()


def stake_status(facts: ChainFacts) -> str:
    if facts.stake < facts.needed:
        return f"below minimum ({format_tokens(facts.needed)} needed)"
    if facts.unbonding:
        return f"ok, {format_tokens(facts.unbonding)} unbonding"
    return "ok"


def epoch_status(work: EpochWork, now: int) -> str:
    if not work.units:
        return "awaiting record"
    # Slashed first: a slash in the second its part was recorded ends the membership
    # in that second, so the pool reads the leaf as not backed, never as paid.
    if work.slashed:
        return "slashed"
    if not work.backed:
        return "never paid: recorded when the node was not in the pool"
    if work.invalidated:
        return "invalidated"
    if work.claimed:
        return "claimed"
    if now < work.unlocks_at:
        return f"{PENDING} — claimable in {duration(work.unlocks_at - now)}"
    return CLAIMABLE


def claimable_epochs(facts: ChainFacts) -> list[int]:
    return [w.epoch for w in facts.epochs if epoch_status(w, facts.now) == CLAIMABLE]


def how_to_claim(node: str, epochs: list[int]) -> str:
    flags = " ".join(f"--epoch {e}" for e in epochs) or "--epoch N"
    return (
        "set provider_key in the node's config to claim from here, or run "
        f"`swarmrl wallet claim <provider key> --node {node} {flags}`"
    )


@dataclass(frozen=True)
class Download:
    step: int
    done: int
    total: int


@dataclass(frozen=True)
class Rejection:
    # "intake" (the receipt), "validation" (the later outcome) or "refused" (refused
    # for good at intake, without a receipt: its order was over, say)
    stage: str
    digest: str
    reason: str


@dataclass
class NodeView:
    node: str
    workers: int = 0  # its worker processes, once started
    step: int | None = None  # the policy step the node generates with
    newest: int | None = None  # the newest policy step announced
    download: Download | None = None
    joined: bool = False
    peers: int | None = None
    running: str = "running"  # running or paused: whether the loop takes orders now
    held: str = ""  # why it is to take none (client.node.machine.holds); "" while nothing holds it
    stopping: str = ""  # "", or the event that ends it: stopping or finishing
    stopped: bool = False
    retry: str = ""  # the failure being waited out, until the node joins again
    no_work: str = ""  # why the orchestrator has no order for the node, until it has one
    rollouts: int = 0
    tokens: int = 0
    tokens_per_second: float | None = None
    rollouts_per_second: float | None = None
    submitted: int = 0
    intake_accepted: int = 0
    intake_rejected: int = 0
    validated: int = 0
    validated_units: int = 0
    invalid: int = 0
    rejections: deque[Rejection] = field(default_factory=lambda: deque(maxlen=LAST_REJECTIONS))
    # Task reward of the node's own rollouts by policy step: (sum, count).
    rewards: dict[int, tuple[float, int]] = field(default_factory=dict)
    chain: ChainFacts | None = None
    chain_error: str = ""
    message: str = ""  # the answer to the last key pressed (a claim, how to claim)

    def __post_init__(self) -> None:
        # Read back from the daemon's JSON (client.node.daemon.control), the deque has no maxlen.
        if self.rejections.maxlen != LAST_REJECTIONS:
            self.rejections = deque(self.rejections, maxlen=LAST_REJECTIONS)

    def apply(self, event: Event) -> None:
        kind = event.kind
        if kind in (EventKind.JOINED, EventKind.WEIGHTS_ANNOUNCED):
            if kind is EventKind.JOINED:
                self.joined, self.retry = True, ""
            if event.step is not None:
                self.newest = max(event.step, self.newest or 0)
        elif kind is EventKind.WEIGHTS_PROGRESS:
            step, done, total = event.step, event.done, event.total
            if step is not None and done is not None and total is not None:
                self.download = Download(step, done, total)
        elif kind is EventKind.WEIGHTS_READY and event.step is not None:
            total = self.download.total if self.download else 1
            self.download = Download(event.step, total, total)
        elif kind is EventKind.WORKERS:
            self.workers = event.total or 0
        elif kind is EventKind.NO_WORK:
            self.no_work = f"{event.reason} (asking again in {event.extra.get('wait', '?')})"
        elif kind is EventKind.ORDER:
            self.step, self.no_work = event.step, ""
        elif kind is EventKind.GENERATED:
            self._generated(event)
        elif kind in (EventKind.SUBMITTED, EventKind.RESENT):
            self.submitted += 1
            if event.units:
                self.intake_accepted += 1
            else:
                self.intake_rejected += 1
                self.rejections.append(Rejection("intake", event.digest or "", event.reason))
        elif kind is EventKind.REFUSED:
            self.submitted += 1
            self.intake_rejected += 1
            self.rejections.append(Rejection("refused", event.digest or "", event.reason))
        elif kind is EventKind.OUTCOME:
            status = event.extra.get("status")
            if status == SubmissionStatus.ACCEPTED:
                self.validated += 1
                self.validated_units += event.units or 0
            elif status == SubmissionStatus.REJECTED:
                self.invalid += 1
                self.rejections.append(Rejection("validation", event.digest or "", event.reason))
        elif kind is EventKind.RETRY:
            self.joined = False
            self.retry = f"{event.reason} (trying again in {event.extra.get('wait', '?')})"
        elif kind is EventKind.PAUSED:
            self.running = "paused"
        elif kind is EventKind.RESUMED:
            self.running = "running"
        elif kind is EventKind.HELD:
            self.held = event.reason
        elif kind in (EventKind.STOPPING, EventKind.FINISHING):
            self.stopping = kind.value
        elif kind is EventKind.STOPPED:
            self.stopped = True

    def _generated(self, event: Event) -> None:
        self.step = event.step
        rollouts = event.rollouts or 0
        tokens = int(event.extra.get("tokens", "0") or 0)
        self.rollouts += rollouts
        self.tokens += tokens
        self.tokens_per_second = event.tokens_per_second
        if event.tokens_per_second and tokens:
            self.rollouts_per_second = rollouts * event.tokens_per_second / tokens
        if event.step is not None and event.reward is not None:
            total, count = self.rewards.get(event.step, (0.0, 0))
            self.rewards[event.step] = (total + event.reward * rollouts, count + rollouts)

    def reward_curve(self) -> tuple[list[int], list[float]]:
        """Mean task reward of the node's rollouts at each policy step, oldest first."""
        steps = sorted(s for s, (_, count) in self.rewards.items() if count)
        return steps, [self.rewards[s][0] / self.rewards[s][1] for s in steps]

    # ---- text the widgets show ----------------------------------------------------

    def state_line(self) -> str:
        """The one reason line: "working", or why the node is not."""
        if self.stopped:
            return "stopped"
        if self.stopping == EventKind.FINISHING.value:
            return "finishing: the order in flight and what waits to be sent, then leaving"
        if self.stopping:
            return "stopping: finishing the order in flight"
        if self.held:
            return (
                self.held if self.running == "paused" else f"{self.held}: after the order in flight"
            )
        if self.retry:
            return self.retry
        if self.no_work:
            return f"no work offered: {self.no_work}"
        return WORKING if self.joined else "not joined yet: joining"

    @property
    def working(self) -> bool:
        return self.state_line() == WORKING

    def identity_lines(self) -> list[str]:
        facts = self.chain
        lines = [
            f"node      {self.node}",
            f"provider  {facts.provider if facts else '…'}",
        ]
        if facts is not None:
            lines.append(f"stake     {format_tokens(facts.stake)} ({stake_status(facts)})")
            lines.append(f"pool      {'joined' if facts.joined else 'not joined'}")
        peers = "…" if self.peers is None else str(self.peers)
        lines.append(f"peers     {peers}")
        if self.chain_error:
            lines.append(f"chain     {self.chain_error}")
        return lines

    def work_lines(self) -> list[str]:
        step = "…" if self.step is None else str(self.step)
        if self.step is not None and self.newest is not None and self.newest > self.step:
            step += f" ({self.newest - self.step} behind step {self.newest})"
        speed = "…" if self.tokens_per_second is None else f"{self.tokens_per_second:.1f}"
        per_second = (
            "" if self.rollouts_per_second is None else f" ({self.rollouts_per_second:.2f}/s)"
        )
        lines = [
            self.state_line(),
            f"policy step {step}",
            f"rollouts    {self.rollouts}{per_second}",
            f"tokens/s    {speed}",
        ]
        if self.workers > 1:
            lines.append(f"workers     {self.workers}, an order split among them")
        if self.download is not None:
            d = self.download
            lines.append(f"weights of step {d.step}: {d.done}/{d.total} shards")
        return lines

    def submission_lines(self) -> list[str]:
        lines = [
            f"submitted {self.submitted}",
            f"intake      accepted {self.intake_accepted}  rejected {self.intake_rejected}",
            f"validation  accepted {self.validated} ({self.validated_units} units)"
            f"  rejected {self.invalid}",
        ]
        lines.extend(f"✗ {r.digest} {r.stage}: {r.reason}" for r in reversed(self.rejections))
        return lines

    def reward_lines(self) -> list[str]:
        facts = self.chain
        lines = []
        if facts is None:
            lines.append("rewards   …")
        else:
            statuses = [(w, epoch_status(w, facts.now)) for w in facts.epochs]
            pending = sum(w.reward for w, s in statuses if s.startswith(PENDING))
            claimable = sum(w.reward for w, s in statuses if s == CLAIMABLE)
            hint = "  (c claims)" if claimable else ""
            lines.append(f"pending   {format_tokens(pending)}")
            lines.append(f"claimable {format_tokens(claimable)}{hint}")
            for w, status in statuses[-EPOCHS_SHOWN:]:
                recorded = f"{w.units} units, {format_tokens(w.reward)}: " if w.units else ""
                lines.append(f"epoch {w.epoch}  {recorded}{status}")
        if self.message:
            lines.append(self.message)
        return lines
