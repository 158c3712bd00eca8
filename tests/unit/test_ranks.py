"""A trainer job that fails says so in one sentence, about the rank it began with: not
a rank that failed after it, its collective cut off by the first one's exit."""

from __future__ import annotations

import atexit
import time

import pytest
import torch.distributed as dist

from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.ranks import joined, run_job

# Two fresh interpreters importing torch.
pytestmark = pytest.mark.slow

LAUNCH = TrainerLaunch(nproc_per_node=2)


def _rank_0_fails() -> None:
    with joined(LAUNCH, "cpu", 2):
        if dist.get_rank() == 0:
            # Slow to exit, as a rank holding a policy and its threads is: the agent
            # sees rank 1 end first, its barrier cut off.
            atexit.register(time.sleep, 2)
            raise ValueError("rank 0 cannot go on")
        dist.barrier()


def test_the_sentence_is_the_rank_that_failed_first():
    sentence = "trainer rank 0 failed: ValueError: rank 0 cannot go on; the job stopped"
    with pytest.raises(ValueError, match=f"^{sentence}$"):
        run_job(LAUNCH, "test-ranks", _rank_0_fails)
