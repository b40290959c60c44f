"""bench/recipe_benchmark.py's table (what RESULTS.md and the README quote is read from it), and how the bench scripts
find the peer Ultralytics environment of bench/peer_env.sh."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peer import find_peer_python, use_peer_config
from bench.recipe_benchmark import table

REPO = Path(__file__).resolve().parents[1]


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


def test_peer_python_comes_from_the_flag_or_peer_python_and_else_one_sentence(tmp_path, monkeypatch):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    monkeypatch.delenv("PEER_PYTHON", raising=False)
    for flag in (None, ""):  # unset, or --peer-python "$PEER_PYTHON" with PEER_PYTHON unset
        with pytest.raises(SystemExit, match="bench/peer_env.sh DIR") as e:
            find_peer_python(flag)
        assert "\n" not in str(e.value)
    assert find_peer_python(str(python)) == str(python)
    monkeypatch.setenv("PEER_PYTHON", str(python))
    assert find_peer_python(None) == str(python)
    with pytest.raises(SystemExit, match="missing/bin/python .*does not exist"):
        find_peer_python(str(tmp_path / "missing" / "bin" / "python"))


def test_peer_config_dir_is_yolo_config_dir_else_the_one_beside_the_peer_python(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # the venv this python would run from
    monkeypatch.delenv("YOLO_CONFIG_DIR", raising=False)
    with pytest.raises(SystemExit, match="not a peer environment.*bench/peer_env.sh DIR"):
        use_peer_config()
    (tmp_path / "yolo-config").mkdir()
    use_peer_config()
    assert os.environ["YOLO_CONFIG_DIR"] == str(tmp_path / "yolo-config")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "mine"))
    use_peer_config()
    assert os.environ["YOLO_CONFIG_DIR"] == str(tmp_path / "mine")


def test_peer_env_sh_wants_one_folder_outside_the_repository(tmp_path):
    script = REPO / "bench" / "peer_env.sh"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert r.returncode == 2 and "usage: bench/peer_env.sh DIR" in r.stderr
    inside = REPO / "runs" / f"peer-env-test-{os.getpid()}"
    r = subprocess.run(["bash", str(script), str(inside)], capture_output=True, text=True)
    assert r.returncode == 2 and "inside the repository" in r.stderr
    assert not inside.exists()  # refused before anything was made there


def test_recipe_benchmark_without_a_peer_python_says_so_before_running_anything(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PEER_PYTHON"}
    command = [sys.executable, "bench/recipe_benchmark.py", "--runs", "peer", "--out", str(tmp_path / "out")]
    r = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert "PEER_PYTHON" in r.stderr and "bench/peer_env.sh DIR" in r.stderr and "\n" not in r.stderr.strip()
    assert not (tmp_path / "out" / "data").exists()
