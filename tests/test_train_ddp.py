"""train.py under torchrun with two CPU processes (issue 4): identical weights on both ranks, one RAM cache shared,
and an out-of-memory or a NaN on one rank only skipping the step on both."""

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from train_runs import REPO, TINY, load, make_wrapper


def torchrun(tmp_path, args, wrapper=None, port=29517):
    """`torchrun --nproc_per_node 2` on the CPU (gloo); each rank saves its final model as rank{R}.pt."""
    saver = tmp_path / f"ddp_{port}.py"
    saver.write_text(
        (
            wrapper.read_text()
            if wrapper
            else (
                "import os, runpy, sys, torch\nsys.path.insert(0, %r)\nsys.argv = ['train.py'] + sys.argv[1:]\n"
                "g = runpy.run_path('train.py', run_name='__main__')\n"
            )
            % str(REPO)
        )
        + textwrap.dedent(f"""
        from utils.ema import unwrap
        torch.save(unwrap(g["model"]).state_dict(), {str(tmp_path)!r} + f"/rank{{os.environ['RANK']}}.pt")
    """)
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        str(saver),
        *map(str, args),
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)  # a hang fails here
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    params = [k for k in rank0 if "running" not in k and "num_batches" not in k]  # BN stats stay per rank (M2)
    different = [k for k in params if not torch.equal(rank0[k], rank1[k])]
    assert not different, different[:5]
    return result


def test_torchrun_two_cpu_processes_end_with_identical_weights(tiny_data, tmp_path):
    # --cache ram: the two processes of this machine must map one copy of the decoded images, not hold two
    wrapper = tmp_path / "cache_probe.py"
    wrapper.write_text(
        f"import json, os, runpy, sys, numpy as np, torch\nsys.path.insert(0, {str(REPO)!r})\n"
        "sys.argv = ['train.py'] + sys.argv[1:]\n"
        "g = runpy.run_path('train.py', run_name='__main__')\nimage = g['train_set'].cache[0]\nbase = image\n"
        "while not isinstance(base, np.memmap) and base.base is not None:\n    base = base.base\n"
        f"with open({str(tmp_path)!r} + '/cache' + os.environ['RANK'] + '.json', 'w') as f:\n"
        "    json.dump({'file': getattr(base, 'filename', None), 'writeable': image.flags.writeable}, f)\n"
    )
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "8", "--out", tmp_path / "ddp", "--cache", "ram", *TINY]
    result = torchrun(tmp_path, args, wrapper)
    assert (tmp_path / "ddp/weights/last.pt").exists()
    probes = [json.loads((tmp_path / f"cache{r}.json").read_text()) for r in (0, 1)]
    assert probes[0]["file"] == probes[1]["file"] and probes[0]["file"].startswith("/dev/shm/yolo-cache-")
    assert not probes[1]["writeable"] and not os.path.exists(probes[0]["file"])  # mapped, read-only, unlinked
    assert "one copy shared by the 2 processes of this machine" in result.stdout + result.stderr


@pytest.mark.parametrize("fault", ["oom", "nan"])
def test_torchrun_fault_on_one_rank_skips_the_step_on_both(tiny_data, tmp_path, fault):
    """Rank 1 alone runs out of memory in (or gets a NaN loss from) the forward of the last micro-step
    of a window: both ranks skip that step, nobody hangs, the weights stay identical, and the window
    after it (--accumulate 2: a no_sync micro-step, then one that all-reduces) runs as usual."""
    if fault == "oom":
        wrapper = make_wrapper(
            tmp_path,
            forward="""
            if RANK == 1 and n == 3:
                raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
        """,
        )
    else:
        wrapper = make_wrapper(
            tmp_path,
            loss="""
            if RANK == 1 and n == 3:
                loss, parts = original_loss(self, maps, targets)
                return loss * float("nan"), parts
        """,
        )
    out = tmp_path / "ddp"
    # 12 images, batch 2 per rank: 3 micro-steps per epoch, windows [0, 1] and [2]; 2 epochs = 4 windows.
    # The fault is in micro-step 3, the one-step window [2] that comes before epoch 2's [0, 1].
    torchrun(
        tmp_path,
        ["--data", tiny_data, "--epochs", "2", "--accumulate", "2", "--out", out, *TINY],
        wrapper=wrapper,
        port=29518 if fault == "oom" else 29519,
    )
    rows = list(csv.DictReader(open(out / "results.csv")))
    column = "oom_skipped_steps" if fault == "oom" else "nonfinite_skipped_steps"
    assert [r[column] for r in rows] == ["1", "0"]
    assert load(out / "weights/last.pt")["ema_updates"] == 3
