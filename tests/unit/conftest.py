"""Fixtures the unit tests of models and rollouts share."""

import pytest

from swarmrl.models.torch_backend import TorchBackend
from tests.model_fixtures import random_tiny_model


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Two policies of the default architecture with different random weights."""
    root = tmp_path_factory.mktemp("models")
    return random_tiny_model(root / "a", seed=1), random_tiny_model(root / "b", seed=2)


@pytest.fixture(scope="module")
def backend(model_dirs):
    """A torch backend on the first of them, on the CPU."""
    return TorchBackend(model_dirs[0], device="cpu")
