"""The README's configuration reference is what the settings models say."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location(
        "readme_reference", ROOT / "docs" / "readme_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def readme():
    return (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["node settings", "orchestrator settings", "training recipe"])
def test_generated_block_matches_the_settings_model(reference, readme, name):
    assert reference.blocks(readme)[name] == reference.generated(name), (
        f"README.md's {name} reference differs from the settings model: run `make readme`"
    )


def test_regeneration_touches_only_the_blocks_and_is_idempotent(reference, readme):
    stale = readme.replace(
        "<!-- BEGIN generated: node settings -->\n",
        "<!-- BEGIN generated: node settings -->\nan old table\n",
    )
    once = reference.render(stale)
    assert reference.render(once) == once
    outside = reference._BLOCK.sub("", once)
    assert outside == reference._BLOCK.sub("", readme)


def test_unknown_or_missing_blocks_are_refused(reference):
    with pytest.raises(ValueError, match="lacks"):
        reference.blocks("no blocks here\n")
    text = "<!-- BEGIN generated: nonsense -->\nx\n<!-- END generated -->\n"
    with pytest.raises(ValueError, match="nonsense"):
        reference.blocks(text)
