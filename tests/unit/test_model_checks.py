"""A model directory is checked whole before anything runs on it (the validator's own
model included), and prefill judges tokens against the sampling that claims them."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from swarmrl.models.backend import SamplingParams
from swarmrl.models.directory import check_model, encode_prompt, load_tokenizer
from swarmrl.models.torch_backend import TorchBackend, parse_device

# -- the model directory -------------------------------------------------------------


@pytest.fixture
def model_copy(model_dirs, tmp_path):
    return shutil.copytree(model_dirs[0], tmp_path / "model")


def rewrite_weights(model_dir, change):
    path = model_dir / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path, metadata={"format": "pt"})


def test_a_whole_model_passes(model_dirs):
    check_model(model_dirs[0])


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda d: (d / "model.safetensors").write_bytes(b""), "not a whole safetensors file"),
        (
            lambda d: (d / "model.safetensors").write_bytes(
                (d / "model.safetensors").read_bytes()[:5000]
            ),
            "not a whole safetensors file",
        ),
        (
            lambda d: rewrite_weights(d, lambda s: s.pop("model.norm.weight")),
            "lacks 1 tensors config.json calls for, such as model.norm.weight",
        ),
        (
            lambda d: rewrite_weights(d, lambda s: s.__setitem__("extra.weight", torch.ones(2))),
            "holds extra.weight, which config.json lacks",
        ),
        (
            lambda d: rewrite_weights(
                d, lambda s: s["model.norm.weight"].__setitem__(0, float("nan"))
            ),
            "model.norm.weight holds values that are not finite",
        ),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps({**json.loads((d / "config.json").read_text()), "hidden_size": 96})
            ),
            "but config.json calls for",
        ),
        (lambda d: (d / "config.json").write_text("{"), "config.json is not a usable model config"),
        (lambda d: (d / "model.safetensors").unlink(), "holds no model.safetensors"),
    ],
)
def test_a_damaged_model_is_one_sentence(model_copy, damage, error):
    damage(model_copy)
    with pytest.raises(ValueError, match="^.*" + error.replace(".", r"\.")) as caught:
        TorchBackend(model_copy, device="cpu")
    assert "\n" not in str(caught.value)


def test_a_missing_model_directory_says_so(tmp_path):
    with pytest.raises(ValueError, match=f"model directory {tmp_path / 'nope'} does not exist"):
        TorchBackend(tmp_path / "nope", device="cpu")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a model directory"):
        load_tokenizer(tmp_path / "file")


def test_a_broken_chat_template_fails_at_load(model_copy):
    (model_copy / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ValueError, match="chat template cannot be applied"):
        TorchBackend(model_copy, device="cpu")


def test_a_device_this_machine_lacks_is_one_sentence():
    assert parse_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        parse_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
            parse_device("cuda")


def test_weights_that_are_not_finite_are_not_loaded_into_a_running_backend(backend, model_copy):
    name = "model.embed_tokens.weight"
    rewrite_weights(model_copy, lambda s: s[name].__setitem__(0, float("inf")))
    before = backend.model.get_input_embeddings().weight.clone()
    with pytest.raises(ValueError, match="not finite"):
        backend.load_weights(model_copy)
    assert backend.model.get_input_embeddings().weight.equal(before)


# -- prefill judges tokens against the claimed sampling ------------------------------


def test_prefill_scores_tokens_under_the_claimed_sampling(backend):
    prompt = encode_prompt(backend.tokenizer, "What is 3 + 4?")
    greedy = backend.generate([prompt], SamplingParams(max_tokens=24, temperature=0))[0]
    scores = backend.prefill(prompt, greedy.output_ids, temperature=0).scores
    assert max(scores.outside) == 0  # every token the argmax
    assert scores.sequence_logprob == 0  # greedy draws exactly this, always

    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.5, seed=3)
    nucleus = backend.generate([prompt], params)[0]
    scores = backend.prefill(prompt, nucleus.output_ids, temperature=1.0, top_p=0.5).scores
    assert max(scores.outside) == 0  # every token inside the nucleus
    # Renormalised over the nucleus, each token is likelier than in the whole distribution.
    assert scores.sequence_logprob > sum(nucleus.logprobs)
    assert scores.logprobs == pytest.approx(nucleus.logprobs, abs=1e-4)

    free = backend.generate([prompt], SamplingParams(max_tokens=24, temperature=1.0, seed=3))[0]
    judged = backend.prefill(prompt, free.output_ids, temperature=1.0, top_p=0.05).scores
    assert max(judged.outside) > 0  # some tokens lie outside a 5% nucleus
    assert max(judged.outside) < 1  # a share of the tail past the nucleus
    argmax = backend.prefill(prompt, free.output_ids, temperature=0).scores
    assert max(argmax.outside) > 0  # nats below the argmax
