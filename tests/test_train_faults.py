"""train.py's faults (issue 4), injected by a wrapper around an unchanged train.py: out of memory, NaN loss, a crash;
and the one-sentence refusals of a bad dataset yaml, checkpoint, --cls-weights list, or --mlflow without MLflow."""

import csv
import math

import pytest
import torch
import yaml
from train_runs import TINY, load, make_wrapper, run, tensors_equal


def test_out_of_memory_in_the_label_assignment_is_redone_on_the_cpu_with_the_same_result(tiny_data, tmp_path):
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "4", "--deterministic", *TINY]
    run([*args, "--out", tmp_path / "plain"])
    wrapper = make_wrapper(
        tmp_path,
        setup="""
        original_assign, assign_calls = utils.loss.assign_targets, []
        def assign(*a, device=None, **kw):
            assign_calls.append(device)
            if len(assign_calls) == 1:  # the first assignment runs out of memory on the GPU
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return original_assign(*a, device=device, **kw)
        utils.loss.assign_targets = assign
        original_run = runpy.run_path
        def run_and_check(*a, **kw):
            try:
                return original_run(*a, **kw)
            finally:
                # the forward ran once
                assert assign_calls[:2] == [None, "cpu"] and calls["forward"] == 1, (assign_calls, calls)
        runpy.run_path = run_and_check
    """,
    )
    result = run([*args, "--out", tmp_path / "oom"], wrapper=wrapper)
    assert "redone on the CPU" in result.stdout + result.stderr
    row = next(csv.DictReader(open(tmp_path / "oom/results.csv")))
    assert row["assign_on_cpu"] == "1" and row["oom_skipped_steps"] == "0"
    plain, retried = load(tmp_path / "plain/weights/last.pt"), load(tmp_path / "oom/weights/last.pt")
    assert tensors_equal(plain["model"], retried["model"])  # BN statistics too: nothing ran twice


# An out-of-memory in the batch's copy to the GPU (where a nearly full GPU fails first, before the forward)
COPY_OOM = """
import utils.data.loader
original_copy, copies = utils.data.loader.batch_to_device, [0]
def batch_to_device(*a, **kw):
    copies[0] += 1
    if copies[0] in FAILING:
        raise torch.OutOfMemoryError("CUDA out of memory (injected in the batch's copy)")
    return original_copy(*a, **kw)
utils.data.loader.batch_to_device = batch_to_device
"""
FORWARD_OOM = """
if n in FAILING:
    raise torch.OutOfMemoryError("CUDA out of memory (injected)")
"""


def oom_wrapper(tmp_path, where, failing):
    """train.py with an out-of-memory in the forward or in the batch's copy, at the calls in `failing` (1-based)."""
    setup = f"FAILING = {failing!r}\n" + (COPY_OOM if where == "copy" else "")
    return make_wrapper(tmp_path, forward=FORWARD_OOM if where == "forward" else "", setup=setup)


@pytest.mark.parametrize("where", ["forward", "copy"])
def test_out_of_memory_in_every_step_stops_the_run_naming_the_batch_size(tiny_data, tmp_path, where):
    wrapper = oom_wrapper(tmp_path, where, range(1, 100))
    result = run(
        ["--data", tiny_data, "--epochs", "3", "--accumulate", "1", "--out", tmp_path / "run", *TINY],
        wrapper=wrapper,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert (
        "out of memory in 3 optimizer steps in a row" in output and "--batch 4" in output and "try --batch 2" in output
    )
    assert "Traceback" not in output
    assert "--batch 4" in (tmp_path / "run/crash/reason.txt").read_text()


@pytest.mark.parametrize("where", ["forward", "copy"])
def test_an_out_of_memory_skips_the_step_and_training_goes_on(tiny_data, tmp_path, where):
    wrapper = oom_wrapper(tmp_path, where, [2])
    run(["--data", tiny_data, "--epochs", "2", "--accumulate", "1", "--out", tmp_path / "run", *TINY], wrapper=wrapper)
    rows = list(csv.DictReader(open(tmp_path / "run/results.csv")))
    assert [r["oom_skipped_steps"] for r in rows] == ["1", "0"]
    assert load(tmp_path / "run/weights/last.pt")["ema_updates"] == 2 * 3 - 1


def test_nan_loss_is_skipped_and_repeated_nan_writes_crash(tiny_data, tmp_path):
    args = ["--data", tiny_data, "--epochs", "1", "--accumulate", "1", *TINY]
    once = make_wrapper(
        tmp_path,
        loss="""
        if n == 1:
            loss, parts = original_loss(self, maps, targets)
            return loss * float("nan"), parts
    """,
    )
    run([*args, "--out", tmp_path / "once"], wrapper=once)
    row = next(csv.DictReader(open(tmp_path / "once/results.csv")))
    assert row["nonfinite_skipped_steps"] == "1"
    state = load(tmp_path / "once/weights/last.pt")
    assert torch.isfinite(state["model"]["head.cls.0.2.weight"]).all() and state["ema_updates"] == 2
    # the NaN step is not in the means
    assert all(math.isfinite(float(row[k])) for k in ("box_loss", "cls_loss", "dfl_loss"))

    always = make_wrapper(
        tmp_path,
        name="always.py",
        loss="""
        loss, parts = original_loss(self, maps, targets)
        return loss * float("inf"), parts
    """,
    )
    result = run([*args, "--epochs", "3", "--out", tmp_path / "dead"], wrapper=always, check=False)
    assert result.returncode != 0
    crash = tmp_path / "dead" / "crash"
    assert "NaN/Inf gradients" in (crash / "reason.txt").read_text()
    batch = torch.load(crash / "batch.pt", weights_only=True)
    assert batch["images"].dtype == torch.uint8 and batch["images"].shape[1:] == (3, 64, 64)
    assert {"args", "epoch", "iteration", "last_checkpoint"} <= yaml.safe_load(
        (crash / "context.yaml").read_text()
    ).keys()
    assert (crash / "environment.json").exists()


def test_uncaught_exception_writes_crash(tiny_data, tmp_path):
    boom = make_wrapper(
        tmp_path,
        loss="""
        if n == 2:
            raise RuntimeError("something unexpected")
    """,
    )
    result = run(["--data", tiny_data, "--epochs", "1", "--out", tmp_path / "run", *TINY], wrapper=boom, check=False)
    assert result.returncode != 0
    assert "something unexpected" in (tmp_path / "run/crash/reason.txt").read_text()


def test_bad_dataset_yaml_and_bad_checkpoint_get_one_sentence(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("path: .\ntrain: images/train\nnames: [a]\n")
    result = run(["--data", bad, *TINY, "--out", tmp_path / "x"], check=False)
    assert result.returncode != 0 and "'val'" in result.stderr and "Traceback" not in result.stderr
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    result = run(["--resume", junk], check=False)
    assert result.returncode != 0 and "junk.pt" in result.stderr and "Traceback" not in result.stderr


def test_a_cls_weights_list_of_the_wrong_length_gets_one_sentence_before_anything_is_written(tiny_data, tmp_path):
    result = run(["--data", tiny_data, "--cls-weights", "1,2", "--out", tmp_path / "x", *TINY], check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        "--cls-weights 1,2 has 2 numbers for a dataset of nc=6 classes; give auto or 6 comma-separated" in result.stderr
    )
    assert not (tmp_path / "x" / "args.yaml").exists() and not any((tmp_path / "x" / "weights").iterdir())


def test_mlflow_without_mlflow_installed_gets_one_sentence_before_anything_is_written(tiny_data, tmp_path):
    wrapper = make_wrapper(tmp_path, setup="sys.modules['mlflow'] = None  # import mlflow now fails, as uninstalled")
    result = run(["--data", tiny_data, "--mlflow", "--out", tmp_path / "x", *TINY], wrapper=wrapper, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--mlflow needs MLflow, which is not installed: pip install mlflow-skinny" in result.stderr
    assert not (tmp_path / "x").exists()
