"""bench/import_probe.py on a package written for the test: two absent dependencies, one imported inside the
other's branch, are both reported in one run (a plain import stops at the first), a present module is not, and
an error the stand-ins cause later is recorded against its target."""
from __future__ import annotations

import json
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
        import absent_alpha.sub                      # absent: reported as first asked for
        from absent_beta import Thing                # absent, and read as a name
        VALUE = Thing.attr.deeper                    # a stand-in's attributes are stand-ins
        from . import second
    """))
    (pkg / "second.py").write_text("import absent_alpha.other\nimport absent_gamma\n")
    (pkg / "broken.py").write_text("import absent_delta\nassert absent_delta.__version__ >= '1'\n")
    return tmp_path


def test_every_absent_module_is_reported_in_one_run(tmp_path):
    root = _package(tmp_path)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from bench import import_probe; "
            "print(json.dumps(import_probe.probe(['probe_pkg', 'probe_pkg.broken'])))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True,
                         cwd=Path(import_probe.__file__).resolve().parents[1])
    result = json.loads(out.stdout)
    assert result["missing"] == ["absent_alpha", "absent_beta", "absent_gamma", "absent_delta"]
    assert list(result["errors"]) == ["probe_pkg.broken"]
    assert "AttributeError" in result["errors"]["probe_pkg.broken"]  # a stand-in has no __version__


def test_a_plain_import_would_stop_at_the_first(tmp_path):
    root = _package(tmp_path)
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import probe_pkg",
                          str(root)], capture_output=True, text=True)
    assert out.returncode != 0 and "No module named 'absent_alpha'" in out.stderr
