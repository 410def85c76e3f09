"""serve.docs_page: written prose placed among the generated sections by a manifest's [[page]], every prose
section exactly once, unknown or repeated sections refused with the manifest named."""
from __future__ import annotations

import pytest

from scalelab.core.sections import ManifestError, read_manifest
from scalelab.serve.docs_page import assemble

SECTIONS = {"title": ["# T", ""], "where": ["## Where", "w", ""], "tp": ["## TP", "t", ""], "open-loop": []}


def _manifest(tmp_path, page: str, prose: str = "<!-- prose: intro -->\nWhy.\n\n<!-- prose: tp -->\nBecause.\n"):
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "serve-prose.md").write_text(prose)
    path = tmp_path / "docs" / "serve.toml"
    path.write_text(f'job = "serve"\nout = "docs/serve.md"\nprose = "docs/serve-prose.md"\nruns = []\n{page}')
    return read_manifest(path, job="serve")


PAGE = ('[[page]]\nprose = "intro"\n[[page]]\nsection = "tp"\n[[page]]\nprose = "tp"\n'
        '[[page]]\nsection = "where"\n[[page]]\nsection = "open-loop"\n')


def test_prose_and_sections_in_page_order(tmp_path):
    text = assemble(_manifest(tmp_path, PAGE), SECTIONS)
    assert text == "# T\n\nWhy.\n\n## TP\nt\n\nBecause.\n\n## Where\nw\n"


def test_without_a_page_the_generated_sections_in_order(tmp_path):
    m = _manifest(tmp_path, "")
    assert assemble(m, SECTIONS) == "# T\n\n## Where\nw\n\n## TP\nt\n"


@pytest.mark.parametrize("page, says", [
    ('[[page]]\nprose = "intro"\n', "in the file but not placed: ['tp']"),
    (PAGE + '[[page]]\nsection = "tp"\n', "placed twice: ['tp']"),
    (PAGE + '[[page]]\nsection = "costs"\n', "unknown: ['costs']"),
    (PAGE + '[[page]]\nsection = "title"\n', "the title is placed first"),
    (PAGE + '[[page]]\nprose = "x"\nsection = "tp"\n', "entry 6 needs exactly one of prose, section"),
])
def test_a_bad_page_names_the_manifest(tmp_path, page, says):
    with pytest.raises(ManifestError, match="serve.toml") as e:
        assemble(_manifest(tmp_path, page), SECTIONS)
    assert says in str(e.value)


def test_the_page_names_sglang_folders_predicted_before_prefill_alone_steps():
    from pathlib import Path
    from types import SimpleNamespace as NS

    from scalelab.serve.docs import _mixed_only_sentence

    def folder(name: str, engine: str, limits: dict) -> NS:
        row = NS(key=NS(engine=engine), provenance={"limits": limits})
        return NS(data=NS(run_dir=Path("runs") / name, predicted_open=(row,)))
    old = folder("7bsg-ladder", "sglang", {"max_num_seqs": 1024})
    new = folder("05bsg-ladder", "sglang", {"max_num_seqs": 256, "mixed_prefill": False})
    other = folder("7b-ladder", "vllm", {"max_num_seqs": 1024})
    said = _mixed_only_sentence([old, new, other], "sglang")
    assert said.endswith("mixed into every decode step: `7bsg-ladder`.")
    assert _mixed_only_sentence([new, other], "sglang") == ""
