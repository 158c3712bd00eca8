"""The node's Prometheus endpoint: events and state in, the scraped text out."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from client.node.daemon.metrics import MAX_REASON_KINDS, OTHER_REASON, NodeMetrics, reason_kind
from client.node.events import Event, EventKind
from client.node.work.loop import NodeState


@pytest.fixture
def metrics() -> Iterator[NodeMetrics]:
    served = NodeMetrics(0)  # any free loopback port
    yield served
    served.close()


def scrape(metrics: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the endpoint serves, by name and labels."""
    url = f"http://127.0.0.1:{metrics.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_work_events_count_rollouts_tokens_and_outcomes(metrics):
    generated = Event(
        EventKind.GENERATED, rollouts=8, tokens_per_second=250.0, step=3, extra={"tokens": "900"}
    )
    for event in (
        Event(EventKind.JOINED, step=5),
        Event(EventKind.ORDER, step=3, order="abc", total=8),
        generated,
        generated,
        Event(EventKind.SUBMITTED, digest="d1", units=8),
        Event(EventKind.SUBMITTED, digest="d2", units=0, reason="policy step 1 is stale: below 2"),
        Event(EventKind.RESENT, digest="d3", units=8),
        Event(EventKind.OUTCOME, digest="d1", units=8, extra={"status": "accepted"}),
        Event(
            EventKind.OUTCOME,
            digest="d3",
            units=0,
            reason="toploc proof 0x12ab does not match",
            extra={"status": "rejected"},
        ),
        Event(EventKind.RETRY, reason="the orchestrator is gone", extra={"wait": "1.0s"}),
    ):
        metrics.on_event(event)

    samples = scrape(metrics)
    assert value(samples, "swarmrl_node_rollouts_total") == 16
    assert value(samples, "swarmrl_node_tokens_total") == 1800
    assert value(samples, "swarmrl_node_tokens_per_second") == 250.0
    assert value(samples, "swarmrl_node_submissions_total", stage="intake", outcome="accepted") == 2
    assert value(samples, "swarmrl_node_submissions_total", stage="intake", outcome="rejected") == 1
    for outcome in ("accepted", "rejected"):
        assert (
            value(samples, "swarmrl_node_submissions_total", stage="validation", outcome=outcome)
            == 1
        )
    assert value(samples, "swarmrl_node_rejections_total", reason="policy step is stale") == 1
    assert value(samples, "swarmrl_node_rejections_total", reason="toploc proof does not") == 1
    assert value(samples, "swarmrl_node_pending_reward_units") == 8
    assert value(samples, "swarmrl_node_retries_total") == 1
    assert value(samples, "swarmrl_node_joined") == 0  # the retry means it must join again
    # Heard of step 5 at join, generating with step 3.
    assert value(samples, "swarmrl_node_published_step") == 5
    assert value(samples, "swarmrl_node_policy_step") == 3
    assert value(samples, "swarmrl_node_staleness") == 2


def test_download_progress_and_staleness_follow_the_weights(metrics):
    metrics.on_event(Event(EventKind.ORDER, step=2))
    metrics.on_event(Event(EventKind.WEIGHTS_PROGRESS, step=4, done=3, total=10))

    samples = scrape(metrics)
    assert value(samples, "swarmrl_node_download_step") == 4
    assert value(samples, "swarmrl_node_download_shards_held") == 3
    assert value(samples, "swarmrl_node_download_shards_total") == 10
    assert value(samples, "swarmrl_node_staleness") == 2

    metrics.on_event(Event(EventKind.WEIGHTS_READY, step=4))
    metrics.update(NodeState(step=4, speed=99.5, joined=True, accepted_units=40), peers=3)

    samples = scrape(metrics)
    assert value(samples, "swarmrl_node_policy_step") == 4
    assert value(samples, "swarmrl_node_staleness") == 0
    assert value(samples, "swarmrl_node_tokens_per_second") == 99.5
    assert value(samples, "swarmrl_node_pending_reward_units") == 40
    assert value(samples, "swarmrl_node_peers") == 3
    assert value(samples, "swarmrl_node_joined") == 1


def test_reason_labels_are_bounded(metrics):
    for i in range(MAX_REASON_KINDS + 5):
        metrics.on_event(
            Event(
                EventKind.SUBMITTED, units=0, reason=f"refused {chr(ord('a') + i % 26) * (i + 1)}"
            )
        )

    samples = scrape(metrics)
    reasons = {
        dict(labels)["reason"]
        for (name, labels) in samples
        if name == "swarmrl_node_rejections_total"
    }
    assert len(reasons) == MAX_REASON_KINDS + 1
    assert value(samples, "swarmrl_node_rejections_total", reason=OTHER_REASON) == 5


def test_reason_kind_drops_numbers_and_digests():
    assert reason_kind("step 7: policy 0xdeadbeef1 too old by 3") == "step policy too old"
    assert reason_kind("") == "unknown"


def test_a_port_in_use_is_one_sentence():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=r"^cannot serve metrics") as refused:
            NodeMetrics(port)
    assert str(refused.value) == (
        f"cannot serve metrics on 127.0.0.1:{port} (address already in use); "
        "set metrics_port to a free port"
    )


def test_close_frees_the_port():
    first = NodeMetrics(0)
    port = first.port
    first.close()
    second = NodeMetrics(port)
    second.close()


def test_a_step_announced_but_not_yet_held_counts_as_staleness(metrics):
    metrics.on_event(Event(EventKind.ORDER, step=2))
    metrics.on_event(Event(EventKind.WEIGHTS_ANNOUNCED, step=5))
    samples = scrape(metrics)
    assert value(samples, "swarmrl_node_published_step") == 5
    assert value(samples, "swarmrl_node_staleness") == 3
