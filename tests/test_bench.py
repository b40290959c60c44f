"""bench/recipe_benchmark.py's table (what RESULTS.md and the README quote is read from it), and how the bench scripts
find the peer Ultralytics environment of bench/peer_env.sh."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peer import find_peer_python, use_peer_config
from bench.real_data_benchmark import table as real_data_table
from bench.recipe_benchmark import is_nms_free, table

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


@pytest.mark.parametrize(
    "flags, nms_free",
    [(["--model", "26n"], True), (["--model", "yolo26n.yaml"], True), (["--model", "11n-e2e"], True),
     (["--model", "11n"], False), (["--lr0", "0.004"], False)],
)  # fmt: skip
def test_nms_free_runs_are_scored_a_second_time_with_nms(flags, nms_free):
    # an NMS-free run on YOLO11n's network (11n-e2e) has no "26" in its name, but its one-to-many head is scored too
    assert is_nms_free(flags) == nms_free


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


def test_real_data_benchmark_refuses_ours_args_that_a_run_sets_itself(tmp_path):
    """--ours-args "--lr0 0.004" with ours-n would train at the recipe's 0.002 (a run's own flags win), a cell that
    looks like an experiment and is the baseline: one sentence, before anything runs."""
    write_voc(tmp_path / "VOC", n_train=1, n_val=1)
    command = [sys.executable, "bench/real_data_benchmark.py", "--voc", str(tmp_path / "VOC"), "--runs", "ours-n"]
    command += ["--ours-args", "--lr0 0.004", "--out", str(tmp_path / "out")]
    r = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--ours-args --lr0: run ours-n sets it itself" in r.stderr
    assert "\n" not in r.stderr.strip() and not (tmp_path / "out" / "data").exists()


def test_real_data_benchmark_refuses_a_distillation_run_without_its_teacher(tmp_path):
    """The *-kd runs distil from --teacher's file on both sides (train.py --teacher, Ultralytics' distill_model=):
    without an existing file, one sentence before anything runs, not a failed cell after the data is prepared."""
    write_voc(tmp_path / "VOC", n_train=1, n_val=1)
    command = [sys.executable, "bench/real_data_benchmark.py", "--voc", str(tmp_path / "VOC"), "--runs", "ours-n-kd"]
    command += ["--teacher", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "out")]
    r = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"--teacher '{tmp_path / 'missing.pt'}': the *-kd runs distil from this" in r.stderr
    assert "\n" not in r.stderr.strip() and not (tmp_path / "out" / "data").exists()


def write_voc(root, n_train=6, n_val=3, size=96):
    """A tiny Pascal VOC folder: bright rectangles of 2 classes on noise, one `difficult` box in the first val image."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    for folder in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (root / folder).mkdir(parents=True)
    ids = [f"img{i:02d}" for i in range(n_train + n_val)]
    for i, image_id in enumerate(ids):
        image = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
        objects = []
        for k, (name, color) in enumerate([("cell", (255, 255, 255)), ("dot", (0, 200, 255))]):
            x1, y1 = int(rng.integers(1, size // 2)), int(rng.integers(1, size // 2))
            x2, y2 = x1 + 20 + 10 * k, y1 + 24
            cv2.rectangle(image, (x1 - 1, y1 - 1), (x2 - 1, y2 - 1), color, -1)
            difficult = int(i == n_train and name == "dot")
            objects.append(
                f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox><xmin>{x1}</xmin>"
                f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
            )
        cv2.imwrite(str(root / "JPEGImages" / f"{image_id}.jpg"), image)
        size_xml = f"<size><width>{size}</width><height>{size}</height><depth>3</depth></size>"
        (root / "Annotations" / f"{image_id}.xml").write_text(f"<annotation>{size_xml}{''.join(objects)}</annotation>")
    (root / "ImageSets/Main/train.txt").write_text("".join(f"{i}\n" for i in ids[:n_train]))
    (root / "ImageSets/Main/val.txt").write_text("".join(f"{i}\n" for i in ids[n_train:]))
    return ids


def test_real_data_benchmark_trains_ours_on_voc_as_it_lies_and_scores_it_with_pycocotools(tmp_path):
    voc, out = tmp_path / "VOC", tmp_path / "out"
    ids = write_voc(voc)
    before = {p: p.stat().st_mtime_ns for p in voc.rglob("*")}
    env = {**os.environ, "YOLO_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "bench/real_data_benchmark.py", "--voc", str(voc), "--runs", "ours-n", "ours-26n"]
    command += ["--seeds", "0", "--epochs", "1", "--imgsz", "64", "--batch", "4", "--out", str(out)]
    r = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in voc.rglob("*")} == before  # nothing written into the dataset

    result = json.loads((out / "ours-n" / "64px" / "e1" / "s0" / "result.json").read_text())
    assert 0.0 <= result["mAP50-95"] <= result["mAP50"] <= 1.0
    assert set(result["per_class"]) == {"cell", "dot"}  # the XML's names, sorted
    assert result["images"] == {"train": 6, "val": 3}
    assert "| ours-n | 1 | 1 |" in r.stdout  # the table
    # YOLO26: scored NMS-free, and again from the same weights with --nms (its one-to-many head), a row of its own
    result_26n = json.loads((out / "ours-26n" / "64px" / "e1" / "s0" / "result.json").read_text())
    nms = result_26n["nms"]
    assert 0.0 <= nms["mAP50-95"] <= nms["mAP50"] <= 1.0 and set(nms["per_class"]) == {"cell", "dot"}
    assert "| ours-26n | 1 | 1 |" in r.stdout and "| ours-26n +NMS | 1 | 1 |" in r.stdout

    gt = json.loads((out / "data" / "val_gt.json").read_text())  # the ground truth both sides are scored against
    assert sorted(im["file_name"] for im in gt["images"]) == [f"{i}.jpg" for i in ids[6:]]
    assert sorted(a["iscrowd"] for a in gt["annotations"]) == [0] * 5 + [1]  # `difficult`: ignored, not a miss
    # the peer's YOLO copy: images linked, not copied; the training boxes of the same records as YOLO rows
    yolo = out / "data" / "yolo"
    assert all((yolo / "images" / "train" / f"{i}.jpg").is_symlink() for i in ids[:6])
    rows = (yolo / "labels" / "val" / f"{ids[6]}.txt").read_text().splitlines()
    assert len(rows) == 1 and rows[0].split()[0] == "0"  # the difficult "dot" stays out of training, as on our side


def test_real_data_table_keeps_the_results_of_a_run_no_longer_defined(tmp_path):
    """A probe's run name leaves RUNS with its code (bench/RESULTS.md names the commit that has it); its results under
    --out still make the table, after the runs defined now, instead of stopping it."""
    for run, value in (("ours-probe-since-removed", 0.5), ("ours-n", 0.6)):
        cell = tmp_path / run / "320px" / "e40" / "s0"
        cell.mkdir(parents=True)
        per_class = {"RBC": {"AP50-95": value, "AP50": value}}
        result = {"mAP50-95": value, "mAP50": value, "per_class": per_class, "seconds": 60}
        (cell / "result.json").write_text(json.dumps(result))
    rows = [line.split(" | ")[0] for line in real_data_table(tmp_path).splitlines() if line.startswith("| ours")]
    assert rows == ["| ours-n", "| ours-probe-since-removed"]


def test_real_suite_prepares_every_set_runs_each_cell_once_and_tables_the_ratios(tmp_path, monkeypatch):
    """bench/real_suite.py on a tiny generated set: our yaml and Ultralytics' copy are written, the cells run in the
    grid's order, a second start skips what has run, and the table gives each pair, its ratio, '-' for what has not."""
    import bench.real_data_benchmark as real_data
    import bench.real_suite as suite
    from utils.data.shapes import STYLES, make_shapes

    make_shapes(tmp_path / "clones" / "tiny", n_train=6, n_val=3, seed=1, size=64)
    names = STYLES["shapes"]["names"]
    yaml_text = f"path: {{clone}}\ntrain: images/train\nval: images/val\nnames: {names}\n"
    monkeypatch.setattr(suite, "SETS", {"tiny": dict(url="https://example.org/u/tiny", licence="-", format="YOLO txt",
                                                     yaml=yaml_text)})  # fmt: skip
    ran, scores = [], {"ours-n": 0.5, "peer-v8n": 0.4, "ours-ft": 0.6}

    def fake_cell(run, data, epochs, seed, cell, args):  # what training and scoring a cell would leave behind
        ran.append((run, epochs, seed))
        result = {"mAP50-95": scores[run], "mAP50": 0.9, "per_class": {}, "seconds": 1.0}
        (cell / "result.json").write_text(json.dumps(result))
        return result

    monkeypatch.setattr(real_data, "run_cell", fake_cell)
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["real_suite.py", "--root", str(tmp_path / "clones"), "--out", str(out), "--peer-python", sys.executable]
    monkeypatch.setattr(sys, "argv", [*argv, "--runs", "ours-ft", "peer-v8n", "ours-n", "--weights", __file__])
    suite.main()
    assert ran == [("ours-n", 20, 0), ("peer-v8n", 20, 0), ("ours-ft", 10, 0), ("ours-ft", 5, 0)]  # tier by tier
    data = out / "tiny" / "data"
    assert "path: " + str((tmp_path / "clones" / "tiny").resolve()) in (data / "data.yaml").read_text()
    assert len(list((data / "yolo" / "images" / "train").iterdir())) == 6  # Ultralytics' copy of the same records
    assert len(json.loads((data / "val_gt.json").read_text())["images"]) == 3
    suite.main()  # started again: every cell has run, none runs twice
    assert len(ran) == 4
    stopped = out / "tiny" / "ours-ft" / "320px" / "e10" / "s0"
    (stopped / "result.json").unlink()  # as a cell killed mid-training leaves it: a half run, no result
    (stopped / "train").mkdir()
    suite.main()
    assert len(ran) == 5 and not (stopped / "train").exists()  # run again, from nothing
    monkeypatch.setattr(
        sys, "argv", [*argv, "--runs", "ours-ft", "--epochs", "5", "--seeds", "1", "--weights", __file__]
    )
    suite.main()
    assert ran[5:] == [("ours-ft", 5, 1)]  # --epochs: only the cells of that length
    lines = (out / "table.md").read_text().splitlines()
    shapes = suite.object_shapes(data / "val_gt.json", 320)
    pairs = "0.500 | 0.400 | 1.25 | 0.500 | - | - | 0.500 | - | - | 0.600 | - | - | 0.600 (2) | - | -"
    row = f"| tiny | 6 / 3 | {len(names)} | {shapes} | {pairs} |"
    assert row in lines  # ours-n thrice: the same recipe, our defaults, against Ultralytics with a step per batch
    assert "| **mean** |  |  |  | 0.500 | 0.400 | **1.25** |" + " - |" * 12 in lines
    assert "| ours-ft (5 epochs) | peer-ft (5 epochs) | ratio |" in lines[3]  # the short fine-tuning, told apart


def test_real_suite_keeps_images_in_ram_on_both_sides_unless_told_not_to_and_gives_parallel_cpu_cells_a_thread(
    tmp_path, monkeypatch, capsys
):
    """The suite's cells train with each repo's RAM cache (the same pixels a draw decodes, so the same figures; the
    loader set the pace of a cell on 2048-px photos); --no-cache gives the commands without it."""
    import subprocess

    import bench.real_data_benchmark as real_data
    import bench.real_suite as suite
    from utils.data.shapes import STYLES, make_shapes

    make_shapes(tmp_path / "clones" / "tiny", n_train=4, n_val=2, seed=1, size=64)
    yaml_text = f"path: {{clone}}\ntrain: images/train\nval: images/val\nnames: {STYLES['shapes']['names']}\n"
    monkeypatch.setattr(suite, "SETS", {"tiny": dict(url="u/tiny", licence="-", format="-", yaml=yaml_text)})
    commands = []

    def record(command, log_path):  # the command a cell would train with; then the cell fails, as a broken one
        commands.append(command)
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(real_data, "run_logged", record)
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "-")  # so that the test's end puts back what was there before it
    monkeypatch.delenv("OMP_NUM_THREADS")
    argv = ["real_suite.py", "--root", str(tmp_path / "clones"), "--peer-python", sys.executable]
    for extra in ([], ["--no-cache"]):
        out = ["--out", str(tmp_path / f"out{len(extra)}")]
        monkeypatch.setattr(sys, "argv", [*argv, *out, "--runs", "ours-n", "peer-v8n-nbs16", *extra])
        suite.main()
    (ours, peer), (ours_plain, peer_plain) = commands[:2], commands[2:]
    assert ours[0] == sys.executable and ours[ours.index("--cache") + 1] == "ram" and "cache=ram" in peer
    assert peer[peer.index("--set") :][-2:] == ["nbs=16", "cache=ram"]  # after the run's own settings
    assert "--cache" not in ours_plain and "cache=ram" not in peer_plain and "nbs=16" in peer_plain
    assert "failed" in capsys.readouterr().out
    assert "OMP_NUM_THREADS" not in os.environ  # one cell at a time keeps every core for its threads
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "out2"), "--runs", "ours-n", "--jobs", "2"])
    suite.main()  # two cells at once on a CPU: a thread each, which the cells inherit
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_our_defaults_are_the_real_suites_same_recipe_on_every_set_so_one_cell_stands_for_both():
    """bench/real_suite.py trains ours-n (AdamW 0.002) once and shows it as our defaults too: true while train.py's
    defaults resolve to that recipe for the suite's runs, up to its largest set (520 photos, 33 batches, 20 epochs)."""
    from argparse import Namespace

    from bench.real_suite import SCRATCH
    from utils.hyperparameters import DEFAULTS
    from utils.settings import resolve_optimizer

    for batches in (8, 13, 33):
        chosen = [
            resolve_optimizer(Namespace(**{**DEFAULTS, **flags, "batch": 16, "epochs": SCRATCH}), batches, {})
            for flags in ({}, {"optimizer": "adamw", "lr0": 0.002})
        ]
        assert chosen[0] == chosen[1] and (chosen[0]["optimizer"], chosen[0]["lr0"]) == ("adamw", 0.002)


def test_real_suite_says_how_many_objects_an_image_holds_and_how_small_they_are_at_the_size(tmp_path):
    """The table's shape column: objects per val image, the median of their size (the square root of the area) once
    the image is letterboxed to the size, and the share under 8 px (where a set needs a larger --imgsz or --tile)."""
    from bench.real_suite import object_shapes

    gt = {
        "images": [{"id": 1, "width": 640, "height": 320}, {"id": 2, "width": 640, "height": 320}],
        "annotations": [  # at 320 px each side halves: sizes 5, 10 and 50 px
            {"image_id": 1, "bbox": [0, 0, 5, 20]},
            {"image_id": 1, "bbox": [0, 0, 40, 10]},
            {"image_id": 2, "bbox": [0, 0, 100, 100]},
        ],
    }
    path = tmp_path / "val_gt.json"
    path.write_text(json.dumps(gt))
    assert object_shapes(path, 320) == "1.5 / 10 (33%)"
    assert object_shapes(path, 1280) == "1.5 / 40 (0%)"
    assert object_shapes(tmp_path / "missing.json", 320) == "?"


def test_distill_cost_times_a_step_without_a_teacher_and_with_it_in_fp32_and_bf16(tmp_path):
    """bench/distill_cost.py, the figure behind issue 66's cost aim (RESULTS.md "Distillation"): three rows, the
    step without a teacher the 1.00x the others are divided by."""
    from train_runs import make_checkpoint

    teacher = make_checkpoint(tmp_path / "s.pt")
    command = [sys.executable, "bench/distill_cost.py", "--teacher", str(teacher), "--imgsz", "64", "--batch", "2"]
    done = subprocess.run([*command, "--steps", "1"], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    rows = [line.strip() for line in done.stdout.splitlines() if "ms per step" in line]
    labels = ["without a teacher", "with the teacher in fp32", "with the teacher in bf16"]
    assert [row.split("  ")[0] for row in rows] == labels, done.stdout
    assert rows[0].endswith(" 1.00x") and all(float(row.split()[-1].rstrip("x")) > 0 for row in rows)


def test_real_data_benchmark_scores_ours_on_a_coco_json_set_in_its_own_image_and_category_ids(tmp_path, monkeypatch):
    """On a COCO json set val.py scores against the json itself and writes its image and category ids (no
    ground_truth.json): the benchmark maps them back to file names and class indices. Detections equal to the truth
    then score 1.0 against the benchmark's own ground truth (the chess set's cells failed here)."""
    from format_sets import read_shapes, write_coco

    import bench.real_data_benchmark as bench
    from utils.data import shapes

    shapes.make_shapes(tmp_path / "shapes", n_train=4, n_val=3, seed=3, size=96)
    write_coco(tmp_path / "coco", read_shapes(tmp_path / "shapes"))
    data_yaml = tmp_path / "coco.yaml"
    data_yaml.write_text(
        f"path: {tmp_path / 'coco'}\ntrain: {{images: images/train, json: annotations/instances_train.json}}\n"
        "val: {images: images/val, json: annotations/instances_val.json}\n"
    )
    voc_yaml, _, names, _ = bench.prepare_yaml(data_yaml, tmp_path / "data", "--data")
    truth = json.loads((tmp_path / "coco" / "annotations" / "instances_val.json").read_text())
    as_found = [
        {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
        for a in truth["annotations"]
    ]  # what val.py --save-json writes on this set: the json's own ids

    def fake_val(command, log):
        val = Path(command[command.index("--out") + 1])
        val.mkdir(parents=True)
        (val / "predictions.json").write_text(json.dumps(as_found))
        (val / "metrics.json").write_text(json.dumps({"mAP50-95": 1.0}))

    monkeypatch.setattr(bench, "run_logged", fake_val)
    named, _ = bench.predict_ours(tmp_path / "cell", voc_yaml, 96, "cpu")
    assert len(named) == len(truth["annotations"]) > 0
    assert bench.score(tmp_path / "data" / "val_gt.json", named, names)["mAP50-95"] == 1.0


def test_preparing_a_set_again_leaves_what_a_running_cell_reads_and_drops_only_what_changed(tmp_path):
    """A second suite started beside a running one prepares the same sets again: it once deleted the YOLO copy that
    the running Ultralytics cell was reading. Unchanged records now touch nothing; a changed split loses only what it
    no longer holds (and Ultralytics' label cache of the old files)."""
    import bench.real_data_benchmark as bench
    from utils.data.shapes import STYLES, make_shapes

    make_shapes(tmp_path / "set", n_train=4, n_val=2, seed=1, size=64)
    data_yaml = tmp_path / "data.yaml"
    data_yaml.write_text(
        f"path: {tmp_path / 'set'}\ntrain: images/train\nval: images/val\nnames: {STYLES['shapes']['names']}\n"
    )
    bench.prepare_yaml(data_yaml, tmp_path / "data", "--data")
    yolo = tmp_path / "data" / "yolo"
    cache = yolo / "labels" / "train.cache"
    cache.write_text("Ultralytics' cache")
    files = sorted(p for p in (tmp_path / "data").rglob("*") if not p.is_dir())
    stamps = {p: (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in files}
    bench.prepare_yaml(data_yaml, tmp_path / "data", "--data")
    assert {p: (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in files} == stamps
    gone = sorted((tmp_path / "set" / "images" / "train").iterdir())[0]
    gone.unlink()
    bench.prepare_yaml(data_yaml, tmp_path / "data", "--data")
    kept = sorted(p.name for p in (yolo / "images" / "train").iterdir())
    assert gone.name not in kept and len(kept) == 3 and not cache.exists()
    assert sorted(p.stem for p in (yolo / "labels" / "train").iterdir()) == sorted(Path(k).stem for k in kept)
