"""`swarmrl demo` end to end, as `make demo` runs it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_runs_every_available_stage(default_model):
    swarmrl = Path(sys.executable).with_name("swarmrl")
    # The session's default model stands in for the one `make demo` caches on first run.
    env = {**os.environ, "SWARMRL_MODELS_DIR": str(default_model.parent)}
    out = subprocess.run([swarmrl, "demo"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert "32/32 chunks accepted" in out.stdout
    assert "16/16 chunks before accepted, 16/16 after rejected" in out.stdout
    assert "refused (shard 2 does not match its expected hash)" in out.stdout
    assert "whole-file check passed, identical=True" in out.stdout
    assert "50 SRL to the treasury, 0 to the validator" in out.stdout
    assert "honest provider claimed 0.3 SRL" in out.stdout
    assert "withdrew 50 after the 7-day period" in out.stdout
    assert "4 nodes hold a verified copy" in out.stdout
    assert "identical=True; the origin sent" in out.stdout
    assert "(node0 banned=True), then gets a verified copy from node1" in out.stdout
    assert "back from a restart: identical=True" in out.stdout
    assert (
        "impostor announced step 2 with its own key: rejected checkpoint step 2 is signed by"
        in (out.stdout)
    )
    assert "one prefill pass each: 48/48 accepted" in out.stdout
    assert (
        "a node that rewrites a task's answer: rejected (its verification info differs from "
        "the task set's"
    ) in out.stdout
    assert (
        "a node that copies one completion across its group: rejected (samples #0, #1, #2, #3 "
        "of its group are one completion, which the claimed sampling repeats with probability"
    ) in out.stdout
    assert "a node that generated with a cheaper model: rejected (TOPLOC rejected" in out.stdout
    for verdict in ("a correct program passes", "a wrong one fails", "an endless loop fails"):
        assert verdict in out.stdout
    assert "one that phones home fails" in out.stdout
    assert "not yet available" in out.stdout
