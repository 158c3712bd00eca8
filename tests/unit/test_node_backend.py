"""The node's backend computes in the precision its work order asks for: loaded in it,
reloaded when an order asks for another, its weights replaced in place when only the
policy step is new."""

from __future__ import annotations

import torch

from client.node.loop import Node
from client.node.settings import NodeSettings
from swarmrl.models.torch_backend import TorchBackend


def dtypes(backend) -> set[torch.dtype]:
    return {p.dtype for p in backend.model.parameters()}


def weights(backend) -> torch.Tensor:
    return backend.model.get_input_embeddings().weight.float()


def test_the_node_holds_the_policy_in_the_orders_precision(tmp_path, model_dirs):
    a, b = model_dirs
    settings = NodeSettings(data_dir=tmp_path, keystore_dir=tmp_path, backend="torch", device="cpu")
    node = Node(settings, account=None)
    node._hold(a, 1, "fp32")
    first = node.backend
    assert dtypes(first) == {torch.float32}
    # A new step in the same precision: the same backend, with the new weights.
    node._hold(b, 2, "fp32")
    assert node.backend is first
    assert torch.equal(weights(first), weights(TorchBackend(b, device="cpu")))
    # An order in bf16: the policy loaded anew in bf16, still the step's weights.
    node._hold(b, 2, "bf16")
    assert node.backend is not first
    assert dtypes(node.backend) == {torch.bfloat16}
    assert (node.backend_step, node.backend_precision, node.state.step) == (2, "bf16", 2)
    bf16 = TorchBackend(b, device="cpu", dtype=torch.bfloat16)
    assert torch.equal(weights(node.backend), weights(bf16))
