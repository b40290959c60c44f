"""bench/recipe_benchmark.py's table: what RESULTS.md and the README quote is read from it."""

import json

from bench.recipe_benchmark import table


def write_cell(out, dataset, run, epochs, seed, map5095):
    cell = out / dataset / run / f"e{epochs}" / f"s{seed}"
    cell.mkdir(parents=True)
    (cell / "result.json").write_text(json.dumps({"mAP50-95": map5095, "mAP50": 2 * map5095}))


def test_table_gives_mean_spread_seeds_and_both_ratios(tmp_path):
    for seed, (ours, peer) in enumerate([(0.20, 0.10), (0.22, 0.12), (0.24, 0.14)]):
        write_cell(tmp_path, "crowd", "ours", 20, seed, ours)
        write_cell(tmp_path, "crowd", "peer", 20, seed, peer)
    write_cell(tmp_path, "crowd", "peer-defaults", 20, 0, 0.05)
    write_cell(tmp_path, "crowd", "ours", 40, 0, 0.30)  # a budget Ultralytics has not run: no ratio there
    lines = table(tmp_path).splitlines()
    assert "| run | 20 epochs | 40 epochs |" in lines
    assert "| ours | 0.220 +/- 0.020 (3) | 0.300 (1) |" in lines
    assert "| peer | 0.120 +/- 0.020 (3) |  |" in lines
    assert "| ours / peer (means) | 1.83 |  |" in lines
    assert "| ours / peer-defaults (means) | 4.40 |  |" in lines
    assert (tmp_path / "table.md").read_text().splitlines() == lines


def test_table_leaves_out_a_ratio_row_with_nothing_to_compare(tmp_path):
    write_cell(tmp_path, "shapes", "ours", 10, 0, 0.1)
    write_cell(tmp_path, "shapes", "peer", 10, 0, 0.05)
    text = table(tmp_path)
    assert "ours / peer (means) | 2.00 |" in text and "peer-defaults" not in text
    assert table(tmp_path / "empty").startswith("no results under")  # --table before any run: a sentence
