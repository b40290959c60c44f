"""bench/recipe_benchmark.py's table: what RESULTS.md and the README quote is read from it."""

import json

from bench.recipe_benchmark import table


def write_cell(out, dataset, run, epochs, seed, map5095, nms=None):
    cell = out / dataset / run / f"e{epochs}" / f"s{seed}"
    cell.mkdir(parents=True)
    result = {"mAP50-95": map5095, "mAP50": 2 * map5095}
    if nms is not None:  # YOLO26: its one-to-many head + NMS as well
        result["nms"] = {"mAP50-95": nms, "mAP50": 2 * nms}
    (cell / "result.json").write_text(json.dumps(result))


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


def test_table_gives_yolo26_both_modes_and_compares_each_with_the_same_mode(tmp_path):
    """Our val.py defaults to YOLO26's NMS-free head, Ultralytics' validator to its one-to-many head + NMS: each
    mode gets its row and the ratios never mix them."""
    write_cell(tmp_path, "shapes", "ours-26n", 10, 0, 0.04, nms=0.05)
    write_cell(tmp_path, "shapes", "peer-26n", 10, 0, 0.01, nms=0.02)
    lines = table(tmp_path).splitlines()
    assert "| ours-26n | 0.040 (1) |" in lines and "| ours-26n +NMS | 0.050 (1) |" in lines
    assert "| peer-26n | 0.010 (1) |" in lines and "| peer-26n +NMS | 0.020 (1) |" in lines
    assert "| ours-26n / peer-26n (means) | 4.00 |" in lines
    assert "| ours-26n +NMS / peer-26n +NMS (means) | 2.50 |" in lines
