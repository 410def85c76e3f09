"""docs/<job>.md regenerate from their manifests in docs/: the calc, serve and grpo pages byte for byte (figures are
written beside the page in the test's folder, so the committed ones are not touched), and each manifest names only
folders or records that exist (a record plain or packed)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from scalelab.calc.docs import docs as calc_docs
from scalelab.core.jsonio import is_stored
from scalelab.grpo.docs import docs as grpo_docs
from scalelab.serve.docs import docs as serve_docs

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("job", ["calc", "pretrain", "serve", "dpo", "grpo"])
def test_manifest_names_existing_results(job):
    m = tomllib.loads((REPO / "docs" / f"{job}.toml").read_text())
    assert m["job"] == job and m["out"] == f"docs/{job}.md"
    # the results folder itself (grpo's blocks name paths below it, some deliberately not there yet) and any path
    # spelled from the repository root
    paths = [v for v in _strings(m) if v.startswith("results/")] + ([m["results"]] if "results" in m else [])
    # a record may be stored packed (x.json.xz for x.json): the pages read it through core.jsonio either way
    missing = [p for p in paths if not ((REPO / p).exists() or is_stored(REPO / p))]
    assert paths and not missing, missing


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


@pytest.mark.parametrize("job, make", [("calc", calc_docs), ("serve", serve_docs), ("grpo", grpo_docs)])
def test_docs_regenerate_byte_identical(tmp_path, monkeypatch, job, make):
    monkeypatch.chdir(REPO)       # the manifest path is printed as given, relative to the repository
    out = make(Path("docs") / f"{job}.toml", tmp_path / f"{job}.md")
    assert out.read_text() == (REPO / "docs" / f"{job}.md").read_text()
