"""The documentation's generated parts are what their sources say: the configuration
reference (docs/configuration.md) what the settings models say, and the benchmarks'
summary (benchmarks/BENCHMARKS.md) its source, docs/benchmarks/index.md."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def configuration():
    return (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["node settings", "orchestrator settings", "training recipe"])
def test_generated_block_matches_the_settings_model(docs, configuration, name):
    assert docs.blocks(configuration)[name] == docs.generated(name), (
        f"docs/configuration.md's {name} reference differs from the settings model: run `make docs`"
    )


def test_regeneration_touches_only_the_blocks_and_is_idempotent(docs, configuration):
    stale = configuration.replace(
        "<!-- BEGIN generated: node settings -->\n",
        "<!-- BEGIN generated: node settings -->\nan old table\n",
    )
    once = docs.render(stale)
    assert docs.render(once) == once
    outside = docs._BLOCK.sub("", once)
    assert outside == docs._BLOCK.sub("", configuration)


def test_unknown_or_missing_blocks_are_refused(docs):
    with pytest.raises(ValueError, match="lacks"):
        docs.blocks("no blocks here\n")
    text = "<!-- BEGIN generated: nonsense -->\nx\n<!-- END generated -->\n"
    with pytest.raises(ValueError, match="nonsense"):
        docs.blocks(text)


def test_the_benchmarks_summary_is_its_source_with_links_from_benchmarks(docs):
    source = (ROOT / "docs" / "benchmarks" / "index.md").read_text(encoding="utf-8")
    summary = (ROOT / "benchmarks" / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert summary == docs.summary(source), (
        "benchmarks/BENCHMARKS.md differs from docs/benchmarks/index.md: run `make docs`"
    )


def test_summary_links_point_from_benchmarks_into_docs(docs):
    text = "[a](toploc.md) [b](trust.md#faults) [c](../security.md) [d](#x) [e](https://x.org/y)"
    assert docs.summary(text) == docs.SUMMARY_NOTE + (
        "[a](../docs/benchmarks/toploc.md) [b](../docs/benchmarks/trust.md#faults) "
        "[c](../docs/security.md) [d](#x) [e](https://x.org/y)"
    )


@pytest.mark.parametrize(
    "page", ["README.md", "benchmarks/BENCHMARKS.md"], ids=["readme", "benchmarks"]
)
def test_relative_links_outside_the_site_resolve(page):
    """The site's own links are checked by `mkdocs build --strict` (make lint); these two
    pages live outside it, so their links to files (and to headings of docs pages) are
    checked here."""
    path = ROOT / page
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve()
        if not resolved.exists() or (anchor and anchor not in _anchors(resolved)):
            dead.append(target)
    assert dead == []


def _anchors(path: Path) -> set[str]:
    """The ids mkdocs gives the headings of a markdown page (its toc extension's slugs)."""
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.*)", line)):
            slug = re.sub(r"[^\w\s-]", "", m[1].strip().lower())
            found.add(re.sub(r"[-\s]+", "-", slug))
    return found
