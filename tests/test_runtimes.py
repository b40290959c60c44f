"""The quick install (requirements-dev.txt, README "Tests") runs the suite without the export formats' runtimes: a
format's tests then skip in one line naming its pip line, and under CI=true (.ci/run, which installs them all) they
fail with that line instead (tests/runtimes.py, read by tests/conftest.py before a test's fixtures)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import runtimes

from utils.export import formats as export_formats

REPO = Path(__file__).resolve().parents[1]
MARKED = "tests/test_export_format_table.py::test_a_missing_package_is_one_sentence_with_the_pip_line_of_that_format"
OPENVINO = "openvino missing: pip install -r requirements-export.txt (or: pip install onnx openvino)"


def pytest_without_openvino(ci):
    """A marked test of the suite, run by pytest with `import openvino` failing as where it is not installed."""
    code = "import sys; sys.modules['openvino'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST_")} | (
        {"CI": "true"} if ci else {}
    )
    command = [sys.executable, "-c", code, "-p", "no:cacheprovider", "-n", "0", "-rs", MARKED]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


def test_a_format_whose_runtime_is_missing_skips_naming_its_pip_line_and_fails_under_ci():
    done = pytest_without_openvino(ci=False)
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout + done.stderr
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 1 and skips[0].endswith(f": {OPENVINO}"), done.stdout  # one line, the format's pip line
    done = pytest_without_openvino(ci=True)
    assert done.returncode == 1 and "1 error" in done.stdout and "skipped" not in done.stdout, done.stdout
    assert f"CI=true: {OPENVINO}" in done.stdout


def test_the_line_names_what_is_missing_and_the_nodeps_install_where_one_of_those_is_missing(monkeypatch):
    assert runtimes.missing("torchscript") is None  # nothing beyond requirements.txt
    monkeypatch.setattr(export_formats, "installed", lambda module: module not in ("nncf", "tf_keras", "trackeval"))
    assert runtimes.missing("openvino") is None
    assert runtimes.missing("openvino", int8=True) == (
        "nncf missing: pip install -r requirements-export.txt (or: pip install onnx openvino nncf)"
    )
    tensorflow = " ".join(package.pip for package in export_formats.by_name("pb").packages())
    assert runtimes.missing("saved_model", "pb") == (  # tf_keras is installed without what it declares
        "tf_keras missing: pip install -r requirements-export.txt && pip install --no-deps -r "
        f"requirements-nodeps.txt (or: pip install {tensorflow})"
    )
    assert runtimes.missing("trackeval") == (
        "trackeval missing: pip install -r requirements-export.txt && pip install --no-deps -r requirements-nodeps.txt"
        " (or: pip install scipy && pip install --no-deps trackeval==1.3.0)"
    )
    monkeypatch.delenv("CI", raising=False)  # as on a contributor's machine (.ci/run sets it)
    with pytest.raises(pytest.skip.Exception, match="^nncf missing: "):
        runtimes.need("openvino", int8=True)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="^CI=true: nncf missing: "):
        runtimes.need("openvino", int8=True)
