"""The library speaks of behaviour, not of this project's own measurements: no results/ path, no measurement-round
or session name, no citation of a design file the repository does not hold, anywhere under src/. A new round is a
manifest entry in docs/, never a code change."""
from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
FORBIDDEN = {
    "a results/ path": re.compile(r"\bresults/"),
    "a round name": re.compile(r"\bround[ _-]?\d", re.IGNORECASE),
    "a variants round name": re.compile(r"\bvariants[_-]?\d", re.IGNORECASE),
    "a session name": re.compile(r"\bsession[ _-]?\d", re.IGNORECASE),
    "a DESIGN.md citation": re.compile(r"DESIGN\.md"),
}


def offences(text: str, where: str) -> list[str]:
    return [f"{where}:{i}: {what}: {line.strip()[:100]}"
            for i, line in enumerate(text.splitlines(), 1)
            for what, pattern in FORBIDDEN.items() if pattern.search(line)]


def test_the_scan_catches_each_kind():
    text = ('x = "results/h200/a.json"\n# round 7 measured it\nv = variants3\n"""session1"""\n'
            "see DESIGN.md\nok = 'the rounding mode'\n")
    found = offences(text, "f.py")
    assert [f.split(": ")[1] for f in found] == ["a results/ path", "a round name", "a variants round name",
                                                 "a session name", "a DESIGN.md citation"]
    assert found[1].startswith("f.py:2:")


def test_src_names_no_results_rounds_or_sessions():
    found = [o for path in sorted(SRC.rglob("*.py")) for o in offences(path.read_text(), str(path.relative_to(SRC)))]
    assert not found, "library code names this project's own results:\n" + "\n".join(found)
