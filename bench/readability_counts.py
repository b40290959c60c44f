"""The reader's counts: how much evidence sits in product code and how long the pages a newcomer reads are.

    python bench/readability_counts.py            # this clone
    python bench/readability_counts.py --list     # also every decimal and dataset name found, with file and line
    python bench/readability_counts.py --check    # exit 1 when a count is over its target (tests/ runs this)

Product Python is every tracked .py outside tests/ and bench/; only its docstrings and comments are read (a
constant whose value is the point stays in the code). A decimal is a number with a fractional part (0.002, 1.5x);
a dataset name is one of the benchmark sets of bench/real_suite.py. Targets (bench/RESULTS.md#readability): at most
10 decimals and no dataset names in product docstrings and comments; README "Current figures" at most 8 rows and at
most 40 decimals in the whole README; bench/RESULTS.md at most 50 KB; docs/ at most 70 KB.
"""

import argparse
import ast
import io
import json
import re
import subprocess
import tokenize
from pathlib import Path

DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+")
# the sets of bench/real_suite.py and the earlier benchmarks; "cells" and "cards" only where they name a set
DATASET = re.compile(r"\b(BCCD|microcontrollers?|aerial[ -]cars?|chess|cards|cells|fall detector|COCO128)\b", re.I)
GENERIC = re.compile(r"\b(\d+|in|grid|anchor|table|red|white)\s+cells\b", re.I)  # a grid's cells, not the set


def product_files(root):
    """Tracked .py files outside tests/ and bench/ (untracked ones too, so a helper's new file counts)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return sorted(root / f for f in listed if not f.startswith(("tests/", "bench/")) and (root / f).exists())


def prose(path):
    """(line, text) of every comment and docstring in one Python file."""
    source = path.read_text()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    found.append((body[0].lineno, body[0].value.value))
    return found


def dataset_names(text):
    """The dataset names in a text, leaving out "cells" where it means a grid's or a table's cells."""
    return [m.group(0) for m in DATASET.finditer(GENERIC.sub("", text))]


def code_counts(root, listing):
    decimals = names = 0
    for path in product_files(root):
        for line, text in prose(path):
            found_decimals, found_names = DECIMAL.findall(text), dataset_names(text)
            decimals, names = decimals + len(found_decimals), names + len(found_names)
            if listing and (found_decimals or found_names):
                print(f"  {path.relative_to(root)}:{line}: {' '.join(found_decimals + found_names)}")
    return decimals, names


def figures_rows(readme):
    """Table rows (not the header or its rule) of the README's "Current figures" section."""
    section = re.search(r"^## Current figures\n(.*?)(?=^## )", readme, re.S | re.M)
    if not section:
        return 0
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")]
    return max(0, len(rows) - 2)


def size_kb(paths):
    return sum(p.stat().st_size for p in paths) / 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the clone to count")
    parser.add_argument("--list", action="store_true", help="print each decimal and dataset name found")
    parser.add_argument("--json", action="store_true", help="print {count: value} as JSON instead of the table")
    parser.add_argument("--check", action="store_true", help="exit 1 when a count is over its target")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    decimals, names = code_counts(root, args.list)
    readme = (root / "README.md").read_text()
    rows = [
        ("decimals in product docstrings and comments", decimals, 10),
        ("dataset names in product docstrings and comments", names, 0),
        ('README "Current figures" rows', figures_rows(readme), 8),
        ("decimals in README.md", len(DECIMAL.findall(readme)), 40),
        ("README.md lines", len(readme.splitlines()), 300),
        ("bench/RESULTS.md KB", round(size_kb([root / "bench/RESULTS.md"]), 1), 50),
        ("docs/ KB", round(size_kb((root / "docs").glob("*.md")), 1), 70),
    ]
    if args.json:
        print(json.dumps({name: value for name, value, _ in rows}))
        return
    width = max(len(name) for name, _, _ in rows)
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>7}  (at most {target}){'' if value <= target else '  OVER'}")
    if args.check and any(value > target for _, value, target in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
