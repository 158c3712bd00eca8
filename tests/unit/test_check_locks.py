"""tools/check_locks.py (run by `make lint`) catches a lock that pyproject.toml has left behind."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def check_locks(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("check_locks", ROOT / "tools" / "check_locks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    copy = tmp_path / "pyproject.toml"
    copy.write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(module, "PYPROJECT", copy)
    return module, copy


def edited(check_locks, old, new):
    module, copy = check_locks
    before = set(module.check())
    text = copy.read_text()
    assert old in text
    copy.write_text(text.replace(old, new))
    return set(module.check()) - before


def test_a_range_that_excludes_the_gpu_locks_torch_fails(check_locks):
    errors = edited(check_locks, '"torch>=2.14"', '"torch>=2.15"')
    assert any("requirements-gpu.lock pins torch==2.14.0" in e for e in errors)
    assert any("digest differs" in e for e in errors)


def test_a_new_dependency_fails_until_relocked(check_locks):
    errors = edited(check_locks, '"trio>=0.26",', '"trio>=0.26",\n    "zstandard>=0.1",')
    assert any("requirements.lock pins no zstandard" in e for e in errors)
    assert any("requirements-gpu.lock pins no zstandard" in e for e in errors)


def test_a_comment_is_not_a_requirement(check_locks):
    assert edited(check_locks, "# its reward chart", "# its chart") == set()
