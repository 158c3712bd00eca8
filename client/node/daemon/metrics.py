"""The node's Prometheus metrics, served on a loopback port.

Fed two ways: :meth:`NodeMetrics.on_event` is a listener of the node's typed
events (what happened: rollouts generated, receipts, validation outcomes,
download progress), and :meth:`NodeMetrics.update` copies what the node holds
now (its policy step, speed, accepted units, peers).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from client.node.events import Event, EventKind
from swarmrl.work.states import SubmissionStatus

if TYPE_CHECKING:
    from client.node.work.loop import NodeState

# Reasons come from the orchestrator; past this many kinds they share one label,
# so the registry cannot grow without bound.
MAX_REASON_KINDS = 32
OTHER_REASON = "other"


class NodeMetrics:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rollouts = Counter("swarmrl_node_rollouts", "Rollouts generated", registry=r)
        self.tokens = Counter("swarmrl_node_tokens", "Completion tokens generated", registry=r)
        self.tokens_per_second = Gauge(
            "swarmrl_node_tokens_per_second", "Generation speed of the last order", registry=r
        )
        self.submissions = Counter(
            "swarmrl_node_submissions",
            "Submissions by stage (intake: the receipt; validation: the later outcome) and outcome",
            ["stage", "outcome"],
            registry=r,
        )
        self.rejections = Counter(
            "swarmrl_node_rejections",
            "Rejected submissions by kind of reason",
            ["reason"],
            registry=r,
        )
        self.policy_step = Gauge(
            "swarmrl_node_policy_step",
            "Policy step of the weights the node generates with",
            registry=r,
        )
        self.published_step = Gauge(
            "swarmrl_node_published_step", "Newest policy step the node has heard of", registry=r
        )
        self.staleness = Gauge(
            "swarmrl_node_staleness", "Published policy step minus the step held", registry=r
        )
        self.download_step = Gauge(
            "swarmrl_node_download_step", "Policy step of the weights being fetched", registry=r
        )
        self.shards_held = Gauge(
            "swarmrl_node_download_shards_held", "Shards of that step on disk", registry=r
        )
        self.shards_total = Gauge(
            "swarmrl_node_download_shards_total", "Shards of that step in all", registry=r
        )
        self.peers = Gauge("swarmrl_node_peers", "Peers connected", registry=r)
        self.pending_units = Gauge(
            "swarmrl_node_pending_reward_units",
            "Work units validation accepted so far (paid once their epoch is recorded)",
            registry=r,
        )
        self.joined = Gauge(
            "swarmrl_node_joined", "1 while the orchestrator knows the node", registry=r
        )
        self.retries = Counter(
            "swarmrl_node_retries", "Failures waited out and retried", registry=r
        )
        # Events arrive from the loop and the heartbeat thread at once.
        self._lock = threading.Lock()
        self._held: int | None = None
        self._published: int | None = None
        self._reason_kinds: set[str] = set()
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=r)
        except OSError as e:
            reason = e.strerror.lower() if e.strerror else str(e)
            raise OSError(
                f"cannot serve metrics on {host}:{port} ({reason}); set metrics_port to a free port"
            ) from None
        self.port: int = self.server.server_port

    def on_event(self, event: Event) -> None:
        kind = event.kind
        with self._lock:
            if kind is EventKind.JOINED:
                self.joined.set(1)
                self._saw_published(event.step)
            elif kind in (EventKind.WEIGHTS_ANNOUNCED, EventKind.WEIGHTS_PROGRESS):
                self._saw_published(event.step)
                if event.step is not None:
                    self.download_step.set(event.step)
                if event.done is not None and event.total is not None:
                    self.shards_held.set(event.done)
                    self.shards_total.set(event.total)
            elif kind is EventKind.WEIGHTS_READY:
                self._saw_published(event.step)
            elif kind in (EventKind.ORDER, EventKind.GENERATED):
                # Both carry the step the backend holds while it works.
                self._saw_held(event.step)
                if kind is EventKind.GENERATED:
                    self._generated(event)
            elif kind in (EventKind.SUBMITTED, EventKind.RESENT):
                # A receipt with units took the submission in; none means intake refused it.
                self._outcome("intake", bool(event.units), event.reason)
            elif kind is EventKind.REFUSED:  # refused for good at intake: no receipt
                self._outcome("intake", False, event.reason)
            elif kind is EventKind.OUTCOME:
                status = event.extra.get("status", "")
                if status in (SubmissionStatus.ACCEPTED, SubmissionStatus.REJECTED):
                    self._outcome("validation", status == SubmissionStatus.ACCEPTED, event.reason)
                if status == SubmissionStatus.ACCEPTED and event.units:
                    self.pending_units.inc(event.units)
            elif kind is EventKind.RETRY:
                self.retries.inc()
                self.joined.set(0)

    def update(self, state: NodeState, peers: int | None = None) -> None:
        """Copies what the node holds now; `peers`: its connected peers, if known."""
        with self._lock:
            self._saw_held(state.step)
            if state.speed is not None:
                self.tokens_per_second.set(state.speed)
            self.pending_units.set(state.accepted_units)
            self.joined.set(1 if state.joined else 0)
            if peers is not None:
                self.peers.set(peers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # frees the port for the next start

    # ---- under the lock ---------------------------------------------------------------

    def _generated(self, event: Event) -> None:
        if event.rollouts is not None:
            self.rollouts.inc(event.rollouts)
        if event.tokens_per_second is not None:
            self.tokens_per_second.set(event.tokens_per_second)
        tokens = event.extra.get("tokens", "")
        if tokens.isdigit():
            self.tokens.inc(int(tokens))

    def _outcome(self, stage: str, accepted: bool, reason: str) -> None:
        outcome = SubmissionStatus.ACCEPTED if accepted else SubmissionStatus.REJECTED
        self.submissions.labels(stage, outcome).inc()
        if not accepted:
            self.rejections.labels(self._reason_kind(reason)).inc()

    def _reason_kind(self, reason: str) -> str:
        kind = reason_kind(reason)
        if kind in self._reason_kinds:
            return kind
        if len(self._reason_kinds) >= MAX_REASON_KINDS:
            return OTHER_REASON
        self._reason_kinds.add(kind)
        return kind

    def _saw_held(self, step: int | None) -> None:
        if step is not None:
            self._held = step
            self.policy_step.set(step)
            self._saw_published(step)

    def _saw_published(self, step: int | None) -> None:
        if step is not None and (self._published is None or step > self._published):
            self._published = step
            self.published_step.set(step)
        if self._held is not None and self._published is not None:
            self.staleness.set(self._published - self._held)


def reason_kind(reason: str) -> str:
    """A rejection's kind for a label: its first few words, without the numbers and
    digests that make each reason unique."""
    words = [w for w in reason.replace(":", " ").split() if not any(c.isdigit() for c in w)]
    return " ".join(words[:4]) or "unknown"
