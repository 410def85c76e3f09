"""bench/import_probe.py on a package written for the test: absent dependencies, one imported inside the other's
module, are all reported in one call (a plain import stops at the first); a present module and an optional one
(guarded by try/except ImportError) are not; a stand-in can be subclassed, subscripted and used as a decorator;
and the first failure that is not a missing module (a version check) is reported as the error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from bench import import_probe


def _package(tmp_path):
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import json                                  # present: not reported
        try:
            import absent_optional                   # optional: its absence never raises
        except ImportError:
            absent_optional = None
        import absent_alpha.sub                      # absent: reported by its top-level name
        from absent_beta import Thing, deco          # absent, and read as names
        class Mine(Thing):                           # a stand-in class can be subclassed
            pass
        ALIAS = Thing[int] | None                    # ... subscripted, and joined in a union
        @deco
        def kept():
            return 7
        assert kept() == 7                           # a stand-in decorator returns the function
        from . import second
    """))
    (pkg / "second.py").write_text("import absent_alpha.other\nimport absent_gamma\n")
    (pkg / "broken.py").write_text("import absent_delta\nraise ImportError('needs tokenizers<=0.23.0')\n")
    return tmp_path


def _probe(root, targets, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(root))  # each round's fresh interpreter finds the package there
    return import_probe.probe(targets, python=sys.executable, max_rounds=10)


def test_every_absent_module_is_reported_in_one_call(tmp_path, monkeypatch):
    result = _probe(_package(tmp_path), ["probe_pkg"], monkeypatch)
    assert result["missing"] == ["absent_alpha", "absent_beta", "absent_gamma"]
    assert result["error"] is None and result["rounds"] == 4


def test_the_first_other_failure_is_the_error(tmp_path, monkeypatch):
    result = _probe(_package(tmp_path), ["probe_pkg", "probe_pkg.broken"], monkeypatch)
    assert result["missing"] == ["absent_alpha", "absent_beta", "absent_gamma", "absent_delta"]
    assert "ImportError: needs tokenizers<=0.23.0" in result["error"]


def test_a_plain_import_would_stop_at_the_first(tmp_path):
    root = _package(tmp_path)
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import probe_pkg",
                          str(root)], capture_output=True, text=True)
    assert out.returncode != 0 and "No module named 'absent_alpha'" in out.stderr


def test_the_written_result_carries_its_command_and_commit(tmp_path):
    script = Path(__file__).resolve().parents[2] / "bench" / "import_probe.py"
    out = tmp_path / "probe.json"
    env = {**os.environ, "SCALELAB_GIT_SHA": "abc123"}
    subprocess.run([sys.executable, str(script), "json", "--out", str(out)], check=True, env=env,
                   capture_output=True, timeout=120)
    d = json.loads(out.read_text())
    assert d["missing"] == [] and d["error"] is None and d["git_sha"] == "abc123"
    assert d["command"].endswith(f"{script} json --out {out}")
