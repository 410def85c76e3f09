"""core's write-up toolkit: number formatting, Markdown tables, deterministic figures, the Doc record and the docs
manifest reader, with hand-computed expected values."""
from __future__ import annotations

import pytest

from scalelab.core import figures, numfmt
from scalelab.core.sections import ManifestError, doc, read_manifest, write_doc
from scalelab.core.tables import LEFT, RIGHT, table


def test_number_formats_by_hand():
    assert numfmt.pct(0.1234) == "12.3%" and numfmt.pct(0.5, 0) == "50%" and numfmt.pct(None) == "—"
    assert numfmt.signed_pct(0.012) == "+1.2%" and numfmt.signed_pct(-0.05) == "-5.0%"
    assert numfmt.points(0.012) == "+1.2" and numfmt.points(None, none="-") == "-"
    assert numfmt.thousands(578_400) == "578k" and numfmt.thousands(1_234_000) == "1.23M"
    assert numfmt.thousands(999_600) == "1,000k"          # below a million stays in thousands
    assert numfmt.si(3.2e9, "B") == "3.2 GB" and numfmt.si(4.5e-5, "s") == "45 µs" and numfmt.si(0, "s") == "0 s"
    assert numfmt.ms(0.01234) == "12.3 ms" and numfmt.ms(2.5, 0) == "2,500 ms"
    assert numfmt.num(None) == "—" and numfmt.num(3.14159, "{:.2f}") == "3.14" and numfmt.num(0.0) == "0"


def test_table_escapes_cells_and_checks_widths():
    lines = table(["a", "b"], [["x|y", 1.5]], align=[LEFT, RIGHT])
    assert lines == ["| a | b |", "|---|---:|", "| x\\|y | 1.5 |"]
    assert table(["a"], [], compact_rule=False) == ["| a |", "| --- |"]
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        table(["a", "b"], [["only"]])


def test_doc_renders_sections_in_order(tmp_path):
    d = doc(("title", ["# T", ""]), ("body", ["text"]))
    assert d.render() == "# T\n\ntext" and [s.name for s in d.sections] == ["title", "body"]
    out = write_doc(doc(("a", ["x"]), trailing_newline=True), tmp_path / "sub" / "X.md")
    assert out.read_text() == "x\n"


def test_manifest_paths_and_errors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "run1").mkdir(parents=True)
    m_path = tmp_path / "docs" / "job.toml"
    m_path.write_text('job = "job"\nout = "docs/job.md"\n[a]\npath = "results/run1"\nmissing = "results/none"\n')
    m = read_manifest(m_path, job="job")
    assert m.root == tmp_path and m.out == tmp_path / "docs" / "job.md"
    assert m.folder("a", "path") == tmp_path / "results" / "run1" and m.get("a", "nope", default=3) == 3
    with pytest.raises(ManifestError, match="a.missing = .* does not exist"):
        m.folder("a", "missing")
    with pytest.raises(ManifestError, match=r"missing \[b.c\]"):
        m.require("b", "c")
    with pytest.raises(ManifestError, match="expected 'other'"):
        read_manifest(m_path, job="other")
    (tmp_path / "docs" / "bad.toml").write_text("job = \n")
    with pytest.raises(ManifestError, match="not valid TOML"):
        read_manifest(tmp_path / "docs" / "bad.toml")
    (tmp_path / "docs" / "noout.toml").write_text('job = "job"\n')
    with pytest.raises(ManifestError, match="missing `out`"):
        read_manifest(tmp_path / "docs" / "noout.toml")


def test_figures_save_the_same_bytes_without_a_version_tag(tmp_path):
    def draw(path):
        fig, (ax,) = figures.axes(1, 1, width_in=3, height_in=2, dpi=50)
        ax.plot([0, 1, 2], [1, 0, 1], label="line")
        figures.label(ax, "x", "y", "t")
        return figures.save(fig, path).read_bytes()
    first, second = draw(tmp_path / "a.png"), draw(tmp_path / "b" / "b.png")
    assert first[:4] == b"\x89PNG" and first == second
    assert b"Software" not in first and b"matplotlib" not in first.lower()
