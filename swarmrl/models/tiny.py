"""The embedded default policy's shape: a character tokenizer and a small Llama.

Small enough to pre-train in about a minute on a laptop CPU, big enough to learn
the demo tasks' worked solutions partly, so that RL has room to improve it.
Training it is the orchestrator's job (``swarmrl model init``); this module only
defines the architecture and the tokenizer, both fully determined by code.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is imported where used: it takes seconds to load
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedModel,
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
    )

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Printable ASCII less the form feed and vertical tab, which nothing writes.
ALPHABET = "".join(c for c in string.printable if c not in "\x0b\x0c\r")
# One user turn, then the assistant's answer right after the newline.
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer over printable ASCII."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_config(vocab_size: int) -> LlamaConfig:
    """A four-layer Llama, 128 wide: about 0.8 M parameters."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def build_model(seed: int) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A freshly initialised model and its tokenizer, the same for the same seed."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(build_config(len(tokenizer)))
    return model, tokenizer


def save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """Write model and tokenizer as an HF directory with safetensors weights."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
