"""bench/readability_counts.py: what it counts in product code and pages, and that the repo stays within its targets."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "readability_counts.py"


def counts(root):
    out = subprocess.run([sys.executable, SCRIPT, "--root", root, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_counts_prose_not_constants(tmp_path):
    """A decimal or a set's name in a comment or docstring counts; a constant's value, or a grid's cells, does not."""
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "a.py").write_text(
        '"""Module: scored 0.452 on BCCD."""\n\n'
        "LR = 0.002  # the usual rate; 3 cells from the anchor\n\n\n"
        "def f():\n"
        '    """Rises in cards, then falls."""\n'
        "    return 1.5  # cut at 1.25x\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("# 0.5 0.6 BCCD: tests do not count\n")
    (tmp_path / "README.md").write_text("# x\n\n## Current figures\n| a | b |\n|---|---|\n| 0.1 | 2.5 |\n\n## More\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "RESULTS.md").write_text("r" * 2000)
    (tmp_path / "docs").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    found = counts(tmp_path)
    assert found["decimals in product docstrings and comments"] == 2  # 0.452 and 1.25, not 0.002 or 1.5
    assert found["dataset names in product docstrings and comments"] == 2  # BCCD, cards
    assert found['README "Current figures" rows'] == 1
    assert found["decimals in README.md"] == 2
    assert found["bench/RESULTS.md KB"] == 2.0


def test_the_repo_stays_within_its_reader_targets():
    """Issue 79's targets hold in this clone: a docstring that gains figures, or a page that grows, fails here."""
    run = subprocess.run([sys.executable, SCRIPT, "--root", REPO, "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
