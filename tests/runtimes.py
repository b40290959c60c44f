"""What a test needs beyond requirements-dev.txt (an export format's runtime, TrackEval) and the one line it says
where that is missing: a skip naming the pip line, except under CI=true, where .ci/run installs every runtime and a
missing one fails (as the SLURM tests do, tests/slurm_cluster.py). A format's packages and pip line are its row's in
utils/export/formats.py, the line export.py prints.

    @needs("openvino", int8=True)           # a test: skipped or failed before its fixtures export anything
    pytest.param("ncnn", marks=needs("ncnn"))  # one case of a parametrised test
    pytestmark = needs("saved_model", "pb")    # every test of a file
"""

import os
from pathlib import Path

import pytest

from utils.export import formats as export_formats

ROOT = Path(__file__).resolve().parents[1]
FULL = "pip install -r requirements-export.txt"  # README "Tests": on top of requirements-dev.txt
NODEPS = "pip install --no-deps -r requirements-nodeps.txt"
# TrackEval declares opencv-python, whose cv2 would replace opencv-python-headless's: installed without its
# dependencies, beside the scipy it runs on (requirements-nodeps.txt)
TRACKEVAL = (export_formats.Package("scipy", "scipy"), export_formats.Package("trackeval", "trackeval"))
TRACKEVAL_LINE = "pip install scipy && pip install --no-deps trackeval==1.3.0"


def needs(*names, int8=False):
    """A mark: the test needs the packages of these export formats (rows of FORMATS; int8: their --int8 ones too),
    or "trackeval". tests/conftest.py reads it before the test's fixtures are set up."""
    return pytest.mark.needs(*names, int8=int8)


def packages_and_line(names, int8=False):
    """The packages the named formats (or TrackEval) need, each once in their rows' order, and their pip line."""
    if names == ("trackeval",):
        return TRACKEVAL, TRACKEVAL_LINE
    precision = "int8" if int8 else "fp32"
    rows = [export_formats.by_name(name) for name in names]
    packages = tuple(dict.fromkeys(package for row in rows for package in row.packages(precision)))
    return packages, "pip install " + " ".join(package.pip for package in packages)


def nodeps():
    """The pip names in requirements-nodeps.txt (installed with --no-deps, after requirements-export.txt)."""
    lines = (ROOT / "requirements-nodeps.txt").read_text().splitlines()
    return {line.split("==")[0].strip() for line in lines if line.strip() and not line.startswith("#")}


def missing(*names, int8=False):
    """None when everything the named formats need is installed, else the one line a test says: what is missing,
    the requirements file that has it, and the pip line of those formats alone."""
    packages, line = packages_and_line(names, int8)
    absent = [package.pip for package in packages if not export_formats.installed(package.module)]
    if not absent:
        return None
    full = FULL + (f" && {NODEPS}" if nodeps() & set(absent) else "")
    return f"{export_formats.joined(absent)} missing: {full} (or: {line})"


def need(*names, int8=False):
    """Skip the running test where what it needs is missing; under CI=true (.ci/run, which installs it) fail."""
    line = missing(*names, int8=int8)
    if line is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {line}", pytrace=False)
    pytest.skip(line)
