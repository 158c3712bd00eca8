"""The orchestrator's Prometheus metrics, served on a loopback port.

Every figure is read from the ledger and the trainer's metrics file, the same
sources ``swarmrl orchestrator status`` reads, so the two never disagree.
"""

from __future__ import annotations

import time
from collections import Counter

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.trainer.metrics import read_metrics
from swarmrl.work.states import NodeState, SubmissionStatus


class OrchestratorMetrics:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.policy_step = Gauge("swarmrl_policy_step", "Newest published policy step", registry=r)
        self.trainer_step = Gauge("swarmrl_trainer_step", "Steps trained", registry=r)
        self.reward = Gauge(
            "swarmrl_task_reward", "Task reward of the last step's groups", registry=r
        )
        self.staleness = Gauge("swarmrl_staleness", "Mean staleness of the last step", registry=r)
        self.nodes = Gauge("swarmrl_nodes", "Nodes by state", ["state"], registry=r)
        self.submissions = Gauge(
            "swarmrl_submissions", "Submissions by outcome", ["status"], registry=r
        )
        self.rejections = Gauge(
            "swarmrl_rejections", "Rejected submissions by reason", ["reason"], registry=r
        )
        self.rollouts = Gauge("swarmrl_rollouts_accepted", "Rollouts accepted", registry=r)
        self.rollouts_per_second = Gauge(
            "swarmrl_rollouts_per_second", "Accepted rollouts per second, lately", registry=r
        )
        self.pending = Gauge(
            "swarmrl_validation_queue", "Submissions awaiting validation", registry=r
        )
        self._last: tuple[float, int] | None = None
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=r)
        except OSError as e:
            raise OSError(
                f"cannot serve metrics on {host}:{port} ({e.strerror or e}); "
                "set metrics_port to a free port"
            ) from None

    def update(self, ledger: Ledger, run: RunDir, published: int | None) -> None:
        if published is not None:
            self.policy_step.set(published)
        rows = read_metrics(run.metrics)
        if rows:
            self.trainer_step.set(rows[-1].get("step", 0))
            self.reward.set(rows[-1].get("task_reward", 0.0))
            self.staleness.set(rows[-1].get("staleness_mean", 0.0))
        states = ledger.nodes.by_state()
        for state in NodeState:
            self.nodes.labels(state).set(states.get(state, 0))
        tally = ledger.submissions.tally()
        for status in SubmissionStatus:
            self.submissions.labels(status).set(tally.count(status))
        kinds: Counter[str] = Counter()
        for reason, count in tally.reasons.items():
            kinds[_reason_kind(reason)] += count
        for kind, count in kinds.items():
            self.rejections.labels(kind).set(count)
        units = tally.units()
        self.rollouts.set(units)
        self.pending.set(tally.count(SubmissionStatus.RECEIVED))
        now = time.monotonic()
        if self._last is not None and now > self._last[0]:
            self.rollouts_per_second.set((units - self._last[1]) / (now - self._last[0]))
        self._last = (now, units)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _reason_kind(reason: str) -> str:
    """A rejection's kind for a label: its first few words, without numbers."""
    words = [w for w in reason.replace(":", " ").split() if not any(c.isdigit() for c in w)]
    return " ".join(words[:4]) or "unknown"
