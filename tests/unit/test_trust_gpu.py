"""The cross-hardware rows' two halves (benchmarks/trust_gpu.py): the archive a GPU
machine writes is judged here as the CPU's own rows are. A GPU is not at hand in the
suite, so the default model samples on the CPU; the code path is the GPU's but for the
device."""

import json
import tarfile

import pytest

from benchmarks import trust_gpu


@pytest.fixture(scope="module")
def archive(default_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "rollouts.tar"
    trust_gpu.generate(out, default_model.parent, device="cpu", scale=1 / 128, only=["default"])
    return out


def test_archive_is_judged_like_the_cpu_rows(archive, default_model):
    rows = trust_gpu.verify([archive], default_model.parent)
    expected = [v for v in trust_gpu.variations() if v.model == "default"]
    assert [(r.variation.sampled, r.variation.temperature) for r in rows] == [
        (v.sampled, v.temperature) for v in expected
    ]
    assert all(r.rollouts == r.variation.group for r in rows)
    assert [(r.variation.label(), r.reasons) for r in rows if r.rejected] == []


def test_archive_of_other_weights_is_refused(archive, default_model, tmp_path):
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    environment = json.loads((tmp_path / "x" / trust_gpu.ENVIRONMENT).read_text())
    environment["weights"]["default"] = "00" * 32
    (tmp_path / "x" / trust_gpu.ENVIRONMENT).write_text(json.dumps(environment))
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w") as tar:
        for path in sorted((tmp_path / "x").iterdir()):
            tar.add(path, arcname=path.name)
    with pytest.raises(SystemExit, match="default weights are not those in"):
        trust_gpu.verify([forged], default_model.parent)
