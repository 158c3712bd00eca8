"""A worker computes in the precision its work order asks for: the policy loaded in it,
loaded again when an order asks for another, its weights replaced in place when only
the policy step is new."""

from __future__ import annotations

import torch

from client.node.work.worker import LocalWorker
from swarmrl.models import load_backend
from swarmrl.models.torch_backend import TorchBackend


def dtypes(backend) -> set[torch.dtype]:
    return {p.dtype for p in backend.model.parameters()}


def weights(backend) -> torch.Tensor:
    return backend.model.get_input_embeddings().weight.float()


def test_a_worker_holds_the_policy_in_the_orders_precision(model_dirs):
    a, b = model_dirs
    worker = LocalWorker(lambda d, p: load_backend("torch", d, device="cpu", precision=p))
    worker.hold(a, 1, "fp32")
    first = worker.backend
    assert dtypes(first) == {torch.float32}
    # A new step in the same precision: the same backend, with the new weights.
    worker.hold(b, 2, "fp32")
    assert worker.backend is first
    assert torch.equal(weights(first), weights(TorchBackend(b, device="cpu")))
    # An order in bf16: the policy loaded anew in bf16, still the step's weights.
    worker.hold(b, 2, "bf16")
    assert worker.backend is not first
    assert dtypes(worker.backend) == {torch.bfloat16}
    assert (worker.step, worker.precision) == (2, "bf16")
    bf16 = TorchBackend(b, device="cpu", dtype=torch.bfloat16)
    assert torch.equal(weights(worker.backend), weights(bf16))
