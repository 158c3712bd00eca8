"""A policy held on a device: what every process that runs one keeps between uses.

A node's worker (``client.node.work.worker``), the orchestrator's validator workers
(``orchestrator.service.validator``) and train local's samplers
(``orchestrator.train_local.sampler``) each hold one policy at a time: a model directory
loaded onto their device in a precision, and kept while only its step changes, when
the new step's weights replace the old ones in place (the same architecture, so no
engine is built again). Another precision loads it anew, and the old engine is let go
first, so two never share the device's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from swarmrl.models.backend import Backend, Precision

# What the policy is loaded in: a Precision, or None for the backend's own choice (a
# holder that never asks for one, as train local's samplers).
P = TypeVar("P", bound=Precision | None)


def _load_weights(backend: Backend, model_dir: Path) -> None:
    backend.load_weights(model_dir)


class HeldPolicy(Generic[P]):
    """One policy on a device: ``load`` builds a backend for a model directory in a
    precision, ``reload`` (by default the backend's ``load_weights``) puts another step's
    weights into it in place."""

    def __init__(
        self,
        load: Callable[[Path, P], Backend],
        reload: Callable[[Backend, Path], None] | None = None,
    ) -> None:
        self._load = load
        self._reload = reload or _load_weights
        self.backend: Backend | None = None
        self.step: int | None = None
        self.precision: P | None = None

    def hold(self, model_dir: Path, step: int, precision: P) -> Backend:
        """The policy in ``model_dir`` (of ``step``) in ``precision``: loaded the first
        time and whenever another precision is asked for, its weights replaced in place
        when only the step is new, kept as it is otherwise."""
        if self.backend is None or self.precision != precision:
            self.backend = None  # the old engine's memory is freed before another loads
            self.backend = self._load(model_dir, precision)
            self.precision = precision
        elif self.step != step:
            self._reload(self.backend, model_dir)
        self.step = step
        return self.backend

    def release(self) -> None:
        """Lets the backend go (its memory with it); the next ``hold`` loads again."""
        self.backend = None
