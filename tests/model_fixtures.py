"""Small models for tests: the default architecture with random weights (fast to
build, no training) saved as real HF directories."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from swarmrl.models import tiny


def random_tiny_model(out: Path, seed: int) -> Path:
    """The default architecture, randomly initialised from ``seed``, saved in ``out``.

    Initialised 5x wider than transformers' default so that greedy decoding
    depends on the prompt: at the default scale every prompt decodes to the same
    run of newlines, and tests comparing outputs would compare nothing.
    """
    tokenizer = tiny.build_tokenizer()
    config = tiny.build_config(len(tokenizer))
    config.initializer_range = 0.1
    torch.manual_seed(seed)
    tiny.save(LlamaForCausalLM(config), tokenizer, out)
    return out


def nudged_model(source: Path, out: Path, scale: float = 1e-4, seed: int = 0) -> Path:
    """``source``'s model after a small step, saved in ``out`` with its tokenizer: every
    weight moved by Gaussian noise of ``scale``, near what a few training steps move
    the default model's (about 6e-5 over three)."""
    shutil.copytree(source, out)
    model = LlamaForCausalLM.from_pretrained(out)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn(weight.shape, generator=noise) * scale)
    model.save_pretrained(out)
    return out
