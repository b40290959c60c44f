"""tools/sweep.py table OUT: one row per experiment folder of OUT, local or SLURM alike."""

import argparse
import csv
import json
from pathlib import Path

from tools.sweep_spec import SpecError, read_json


def last_row(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if len(rows) < 2:
        return {}
    # train.py may pad its columns with spaces to line them up
    return {k.strip(): number(v.strip()) for k, v in zip(rows[0], rows[-1])}


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def experiment_status(folder):
    states = {s.get("status") for s in read_json(folder / "stat", {}).values() if isinstance(s, dict)}
    for state in ("fail", "interrupted", "running", "success"):
        if state in states:
            return state
    return ""


def cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value if isinstance(value, str) else json.dumps(value)


def table(argv):
    parser = argparse.ArgumentParser(
        prog="tools/sweep.py table",
        description=(
            "One row per experiment folder of OUT: the parameters that differ across them, then the "
            "last row of any results.csv and the numbers of any metrics.json found in the folder."
        ),
    )
    parser.add_argument("out", help="the sweep's output folder")
    parser.add_argument("--sort", metavar="METRIC", help="sort by this metric, best (largest) first")
    parser.add_argument("--csv", metavar="FILE", help="also write the table to FILE as CSV")
    args = parser.parse_args(argv)

    found = []
    for folder in sorted(Path(args.out).iterdir()) if Path(args.out).is_dir() else []:
        params = read_json(folder / "param")
        if not isinstance(params, dict):
            continue
        metrics = {}
        for path in sorted(folder.rglob("results.csv")):
            metrics.update(last_row(path))
        for path in sorted(folder.rglob("metrics.json")):  # val.py's numbers beat train's last epoch
            data = read_json(path, {})
            metrics.update(
                {k: v for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}
            )
        found.append((folder.name, experiment_status(folder), params, metrics))
    if not found:
        raise SpecError(f"no experiment folders (folders with a 'param' file) in {args.out}")

    def columns(dicts):
        return list(dict.fromkeys(k for d in dicts for k in d))

    varying = [
        k
        for k in columns(f[2] for f in found)
        if len({json.dumps(f[2].get(k), sort_keys=True, default=str) for f in found}) > 1
    ]
    metric_names = columns(f[3] for f in found)
    if args.sort:
        if args.sort not in metric_names:
            raise SpecError(f"no metric named '{args.sort}' in {args.out} (found: {', '.join(metric_names)})")
        # no value: last
        found.sort(key=lambda f: (0, -f[3][args.sort]) if isinstance(f[3].get(args.sort), (int, float)) else (1, 0))

    rows = [["name", "status", *varying, *metric_names]]
    rows += [
        [name, status, *(cell(params.get(k)) for k in varying), *(cell(metrics.get(m)) for m in metric_names)]
        for name, status, params, metrics in found
    ]
    for row in rows:
        print("\t".join(row))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return 0
