"""`swarmrl bench load`: a small real run (an orchestrator process, a judge, a worker of
simulated nodes, the probe, and a heartbeat flood in the run's second half) whose every
receipt is in the ledger once, and the figures the report is made of."""

from __future__ import annotations

import os

import pytest

from benchmarks import load
from benchmarks.load_nodes import TOO_MANY


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SWARMRL_* of the machine running the tests reaches the orchestrator's settings."""
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> load.Result:
    """12 nodes in one process, 12 s quiet and 12 s under a flood of 20 heartbeats/s."""
    options = load.Options(
        nodes=12,
        minutes=0.4,
        processes=1,
        flood_heartbeats=20.0,
        sample_seconds=1.0,
        ramp=2.0,
        settle=3.0,
        keep=tmp_path_factory.mktemp("load"),
    )
    return load.run(options)


def test_every_receipt_is_in_the_ledger_once_and_nothing_unacknowledged(
    flooded: load.Result,
) -> None:
    check = flooded.ledger
    assert check.receipts > 0
    assert check.ok, check
    assert check.ledger_rows == check.receipts + check.unacknowledged_in_flight
    assert check.rejected_at_intake == 0  # honest nodes' records answer their orders
    assert flooded.joined == 12


def test_submissions_flow_and_the_probe_is_measured(flooded: load.Result) -> None:
    quiet, flood = flooded.phases
    assert (quiet.name, flood.name) == (load.QUIET, load.FLOOD)
    assert quiet.offered_per_second > 0
    assert quiet.receipts_per_second > 0
    assert quiet.heartbeats_per_second > 0
    for latency in (quiet.join, quiet.order, quiet.submit):
        assert latency.count > 0
        assert latency.p50 is not None
        assert latency.p99 is not None
        assert 0 < latency.p50 <= latency.p99
    assert quiet.probe_receipts > 0


def test_the_orchestrators_cpu_and_memory_are_sampled(flooded: load.Result) -> None:
    in_window = [mib for t, mib in flooded.orchestrator_rss if t >= 0]
    assert len(in_window) >= 3
    assert all(mib > 0 for mib in in_window)
    assert flooded.orchestrator_cpu > 0
    assert 0 < flooded.cpu_by_process[load.LOOP] <= flooded.orchestrator_cpu


def test_the_flood_is_refused_while_the_probe_is_still_served(flooded: load.Result) -> None:
    flood = flooded.attacks["flood"]
    assert flood[f"refused: {TOO_MANY}"] > 0
    assert flood["sent"] > flood["answered"]
    under_flood = flooded.phases[1]
    assert under_flood.probe_receipts > 0
    assert under_flood.order.count > 0


def test_the_report_states_its_figures_and_assumptions(
    flooded: load.Result, capsys: pytest.CaptureFixture[str]
) -> None:
    load.report(flooded)
    out = capsys.readouterr().out
    assert "| quiet |" in out
    assert "| heartbeat flood |" in out
    assert "ledger check OK" in out
    assert "assumptions:" in out


def test_a_profile_is_summed_by_area_request_and_frame() -> None:
    lines = [
        "Host._main (swarmrl/p2p/host.py:154);Host._handle_upload (swarmrl/p2p/host.py:276);"
        "Connection.write (orchestrator/service/ledger/connection.py:140) 6",
        "Host._main (swarmrl/p2p/host.py:154);read (libp2p/stream_muxer/yamux/yamux.py:10) 3",
        "WorkServer.work (orchestrator/service/work_server.py:300);"
        "keccak (eth_utils/crypto.py:1) 1",
        "not a sample line",
    ]
    summary = load.summarize_profile(lines)
    assert summary["samples"] == 10
    assert summary["areas"] == {
        "ledger (SQLite)": 0.6,
        "yamux": 0.3,
        "EIP-712 (sign, recover)": 0.1,
    }
    assert summary["handlers"] == {"submit": 0.6, "other": 0.3, "work": 0.1}
    assert summary["top"][0] == (
        "Connection.write (orchestrator/service/ledger/connection.py:140)",
        0.6,
    )


def test_memory_growth_is_a_least_squares_slope_per_minute() -> None:
    assert load.growth([(0.0, 100.0), (30.0, 101.0), (60.0, 102.0)]) == pytest.approx(2.0)
    assert load.growth([(0.0, 100.0), (60.0, 100.0)]) is None
    assert load.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert load.percentile([], 0.99) is None
