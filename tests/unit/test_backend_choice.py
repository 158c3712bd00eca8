"""Which backend and device a node's settings pick (the node and its doctor ask the
same function, so they cannot disagree)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import swarmrl.models
from swarmrl.models import BACKENDS, choose_backend, gpu_device_files, resolve_device


def test_the_backends_are_the_names_the_join_report_carries():
    assert BACKENDS == ("torch", "vllm")


@pytest.mark.parametrize("backend", ["torch", "vllm"])
def test_a_named_backend_is_kept_whatever_the_device(backend):
    assert choose_backend(backend, "cpu") == backend
    assert choose_backend(backend, "cuda:1") == backend


def test_auto_on_a_cpu_is_torch():
    assert choose_backend("auto", "cpu") == "torch"
    assert choose_backend("auto", "mps") == "torch"


def test_auto_on_this_machine_follows_what_it_has():
    gpu = torch.cuda.is_available()
    vllm = importlib.util.find_spec("vllm") is not None
    assert resolve_device("auto") == ("cuda" if gpu else "cpu")
    assert choose_backend("auto", "auto") == ("vllm" if gpu and vllm else "torch")


def test_auto_on_a_gpu_is_vllm_only_where_it_is_installed(monkeypatch):
    # A GPU cannot be had here: the one decision that needs it is checked with torch's
    # answer, the driver's device files and the import system's standing in for a GPU
    # machine's.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(swarmrl.models, "gpu_device_files", lambda: True)
    assert resolve_device("auto") == "cuda"
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return object() if name == "vllm" else real_find_spec(name, *args)

    assert choose_backend("auto", "cuda:0") == ("vllm" if real_find_spec("vllm") else "torch")
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert choose_backend("auto", "auto") == "vllm"
    assert choose_backend("auto", "cuda:1") == "vllm"
    assert choose_backend("auto", "cpu") == "torch"


def test_auto_without_a_gpu_driver_is_cpu_without_loading_torch(monkeypatch):
    """A node's daemon resolves `auto` and runs no model: where no driver is, it must not
    pay torch's import for the answer (seconds of CPU and 400 MiB it would keep)."""
    if gpu_device_files():
        pytest.skip("this machine has a GPU driver's device files")
    probe = "import sys; from swarmrl.models import resolve_device as r; " + (
        "print(r('auto'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "False"]
    # And with the driver's files there, torch's answer is the one taken.
    monkeypatch.setattr(swarmrl.models, "gpu_device_files", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
