"""train.py's run options end to end (issue 4): --weights, --freeze, --multi-scale, --cache ram, --amp on the CPU,
--patience, --single-cls, --compile, --reg-max 1, the yaml's defaults:, a resume on fewer GPUs."""

import csv
import json
import math
import os
import re
import shutil

import pytest
import torch
import yaml
from train_runs import TINY, load, make_wrapper, run


@pytest.fixture(scope="module")
def one_epoch_run(tiny_data, tmp_path_factory):
    """A finished one-epoch run (--accumulate 1) that several tests start from: each copies or reads it, none edits
    it (a train.py run fewer on the 2-core machines the suite is sized for)."""
    out = tmp_path_factory.mktemp("one_epoch") / "run"
    run(["--data", tiny_data, "--epochs", "1", "--accumulate", "1", "--out", out, *TINY])
    return out


def test_adamw_steps_after_every_batch_and_sgd_after_64_images_unless_told():
    """--nominal-batch auto (the default): AdamW, which auto picks for short runs, takes a step per batch (BCCD from
    scratch: 0.558 against 0.466 mAP50-95 at 20 epochs); SGD and MuSGD keep 64 images per step; a given value is
    kept. Each auto says what it became; 0, the old spelling of auto (old last.pt files), still means it."""
    usual = "auto: adamw's usual"
    assert resolve("auto") == (("adamw", 0.002, 16, 0.1, 0.937), {
        "optimizer": "--optimizer auto: 500 iterations", "lr0": usual, "nominal_batch": f"{usual}, a step per batch",
        "warmup_bias_lr": usual, "momentum": usual, "ema_floor": usual})  # fmt: skip
    assert resolve("auto", lr0=0.0, nominal_batch=0)[0] == resolve("auto")[0]
    assert resolve("sgd", lr0=0.0, nominal_batch=0, fine_tuning=True)[0] == ("sgd", 0.01, 64, 0.1, 0.937)
    assert resolve("auto", keys=("ema_floor",))[0] == (0.0,)
    assert resolve("auto", epochs=2000)[0] == ("sgd", 0.01, 64, 0.1, 0.937)
    assert resolve("musgd")[0] == ("musgd", 0.01, 64, 0.1, 0.937)
    assert resolve("adamw", nominal_batch=64)[0] == ("adamw", 0.002, 64, 0.1, 0.937)


def test_a_fine_tuning_runs_recipe_follows_its_length_against_its_warmup():
    """--weights, AdamW, warmup 3 epochs (floor 100 iterations), batch 16. 5 and 10 epochs of BCCD's 13 batches (65
    and 130 iterations, under 1.5x the warmup) keep AdamW's lr0 0.002 and a step per batch, biases warmed up from
    0.01. Cards' 10 epochs of 19 batches (190, 1.5x the warmup or more) and cells' 33 (330) take Ultralytics' AdamW
    settings: lr0 0.00143, a step per 64 images, biases warmed up from 0, beta1 0.9 (cards: 0.781 against 0.715,
    cells level, neither dipping). Each choice says why; a scratch run and SGD keep their usual values."""
    FINE_TUNE_BIAS_LR, FINE_TUNE_LR0 = 0.01, 0.00143  # the fine-tuning table's (utils/hyperparameters.py)
    for epochs in (5, 10):
        (_, lr0, nb, bias, momentum), sources = resolve("auto", epochs=epochs, batches=13, fine_tuning=True)
        assert (lr0, nb, bias, momentum) == (0.002, 16, FINE_TUNE_BIAS_LR, 0.937)
        assert sources["lr0"].startswith(f"auto, fine-tuning: {13 * epochs} iterations, under 1.5x the 100-iteration")
    assert sources["warmup_bias_lr"].startswith("auto, fine-tuning:")
    assert not sources["momentum"].startswith("auto, fine-tuning")
    (optimizer, lr0, nb, bias, momentum), sources = resolve("auto", epochs=10, batches=19, fine_tuning=True)
    assert (optimizer, lr0, nb, bias, momentum) == ("adamw", FINE_TUNE_LR0, 64, 0.0, 0.9)
    assert all("190 iterations, 1.5x the 100-iteration warmup" in sources[k] for k in ("nominal_batch", "momentum"))
    assert resolve("auto", epochs=10, batches=33, fine_tuning=True)[0][1:] == (FINE_TUNE_LR0, 64, 0.0, 0.9)
    assert resolve("auto", epochs=10, batches=14, fine_tuning=True)[0][2] == 16  # 140 iterations: 1.4x, not 1.5x
    assert resolve("auto", epochs=10, batches=15, fine_tuning=True)[0][2] == 64  # 150: 1.5x
    assert resolve("auto", epochs=10, batches=19)[0] == ("adamw", 0.002, 16, 0.1, 0.937)  # from scratch
    assert resolve("sgd", epochs=10, batches=19, fine_tuning=True)[0] == ("sgd", 0.01, 64, 0.1, 0.937)


def test_a_long_fine_tuning_run_averages_its_weights_over_about_its_last_ten_steps():
    """Such a run ends long before the usual EMA (tau 2000 updates) averages anything, so validation saw the last
    step's weights: cells (330 iterations) fell to 60% of its best at epoch 3, where its warmup ends. The long
    recipe's EMA floor (0.9: about the last ten steps from the start) smooths that; the shorter runs, the scratch runs
    and a given --ema-floor keep theirs."""
    FINE_TUNE_EMA_FLOOR = 0.9  # the fine-tuning table's (utils/hyperparameters.py)
    long = dict(epochs=10, batches=19, fine_tuning=True, keys=("ema_floor",))
    (floor,), sources = resolve("auto", **long)
    assert floor == FINE_TUNE_EMA_FLOOR == 0.9
    assert sources["ema_floor"].startswith("auto, fine-tuning: 190 iterations")
    for short_or_scratch in (dict(epochs=10, batches=13, fine_tuning=True), dict(epochs=10, batches=19)):
        assert resolve("auto", keys=("ema_floor",), **short_or_scratch)[0] == (0.0,)
    assert resolve("auto", ema_floor=0.5, **long)[0] == (0.5,)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=rf"--ema-floor {bad}: give 0 \(off\) or more, under 1"):
            resolve("auto", ema_floor=bad, **long)


def test_a_fine_tuning_run_keeps_every_setting_given_on_the_command_line():
    """A given --lr0, --nominal-batch, --warmup-bias-lr or --momentum wins over the fine-tuning recipe, whatever the
    run's length; the others are still chosen by it."""
    long, short = dict(epochs=10, batches=19, fine_tuning=True), dict(epochs=5, batches=13, fine_tuning=True)
    assert resolve("auto", lr0=0.003, **long)[0][1:] == (0.003, 64, 0.0, 0.9)
    assert resolve("auto", nominal_batch=16, **long)[0][1:] == (0.00143, 16, 0.0, 0.9)
    assert resolve("auto", warmup_bias_lr=0.05, momentum=0.95, **long)[0][1:] == (0.00143, 64, 0.05, 0.95)
    assert resolve("auto", warmup_bias_lr=0.0, **short)[0][3] == 0.0
    assert resolve("auto", warmup_bias_lr=0.05, **short)[0][3] == 0.05


def resolve(
    optimizer,
    nominal_batch="auto",
    epochs=50,
    batches=10,
    warmup_epochs=3.0,
    lr0="auto",
    fine_tuning=False,
    keys=("optimizer", "lr0", "nominal_batch", "warmup_bias_lr", "momentum"),
    **given,
):
    """utils.settings.resolve_optimizer for a run of `epochs` x `batches` at batch 16, warmup_bias_lr, momentum and
    ema_floor auto unless `given` on the command line: (the resolved values of `keys`, the sources it noted). A
    given lr0 or nominal_batch counts as given."""
    from argparse import Namespace

    from utils.settings import resolve_optimizer

    sources = dict.fromkeys(given, "command line")
    sources |= {
        key: "command line" for key, value in (("lr0", lr0), ("nominal_batch", nominal_batch)) if value != "auto"
    }
    args = Namespace(optimizer=optimizer, lr0=lr0, nominal_batch=nominal_batch, batch=16, epochs=epochs)
    args.warmup_epochs, args.warmup_bias_lr = warmup_epochs, given.get("warmup_bias_lr", "auto")
    args.momentum, args.ema_floor = given.get("momentum", "auto"), given.get("ema_floor", "auto")
    chosen = resolve_optimizer(args, batches, sources, fine_tuning)
    return tuple(chosen[key] for key in keys), sources


def test_accumulation_windows_ramp_over_the_warmup_and_partition_each_epoch():
    from utils.optim import accumulation_windows

    assert accumulation_windows(0, 10, 4, 0, ramp=True) == {3: 4, 7: 4, 9: 2}  # the last window ends the epoch
    assert accumulation_windows(0, 10, 4, 100, ramp=False) == {3: 4, 7: 4, 9: 2}
    epochs = [accumulation_windows(e, 50, 4, 120, ramp=True) for e in range(4)]
    for windows in epochs:  # contiguous windows that cover the epoch exactly
        ends = sorted(windows)
        assert ends[-1] == 49 and [e - windows[e] for e in ends] == [-1] + ends[:-1]
    sizes = [size for windows in epochs for size in windows.values()]
    assert sizes[:15] == [1] * 15 and sizes[-1] == 2 and max(sizes) == 4  # 1 at first, 4 after the warmup
    assert len(sizes) > 1.5 * sum(len(accumulation_windows(e, 50, 4, 120, ramp=False)) for e in range(4))
    assert accumulation_windows(2, 50, 4, 120, ramp=True) == epochs[2]  # a pure function: resume sees the same


def test_dataset_yaml_defaults_apply_and_flags_given_win(tiny_data, tmp_path):
    cfg = yaml.safe_load(tiny_data.read_text())
    with_defaults = tiny_data.parent / "with_defaults.yaml"
    with_defaults.write_text(yaml.safe_dump({**cfg, "defaults": {"epochs": 7, "lr0": 0.005, "close_mosaic": 2}}))
    run(["--data", with_defaults, "--lr0", "0.003", "--benchmark", "1", "--out", tmp_path / "run", *TINY])
    resolved = yaml.safe_load((tmp_path / "run" / "args.yaml").read_text())
    assert (resolved["epochs"], resolved["close_mosaic"], resolved["lr0"]) == (7, 2, 0.003)
    with_defaults.write_text(yaml.safe_dump({**cfg, "defaults": {"epoch": 7}}))
    result = run(["--data", with_defaults, "--benchmark", "1", "--out", tmp_path / "bad", *TINY], check=False)
    assert result.returncode != 0 and "'epoch'" in result.stderr and "Traceback" not in result.stderr


def test_weights_freeze_multi_scale_and_the_other_run_options(tiny_data, one_epoch_run, tmp_path):
    """--weights initialises, --freeze keeps those parameters out of the optimizer and unchanged,
    --multi-scale changes the size per iteration (multiples of 32 in 0.5-1.5x imgsz), and --cache ram,
    --checkpoint-activations, --profile and --benchmark run through and leave what they promise."""
    sizes = make_wrapper(
        tmp_path,
        loss="""
        print("input size", maps[0].shape[-1] * 8)
    """,
    )
    options = ["--multi-scale", "--cache", "ram", "--checkpoint-activations", "--profile", "--accumulate", "1"]
    result = run(
        [
            "--data",
            tiny_data,
            "--epochs",
            "2",
            "--weights",
            one_epoch_run / "weights/last.pt",
            "--freeze",
            "stem,down2",
            *options,
            "--out",
            tmp_path / "second",
            *TINY,
        ],
        wrapper=sizes,
    )
    seen = [int(s) for s in re.findall(r"input size (\d+)", result.stdout)]
    assert len(seen) == 6 and len(set(seen)) > 1 and set(seen) <= {32, 64, 96}, seen
    first, second = load(one_epoch_run / "weights/last.pt"), load(tmp_path / "second/weights/last.pt")
    # a fine-tuning run far past its (here absent) warmup: Ultralytics' AdamW settings, said on the line naming the file
    log = (tmp_path / "second/train.log").read_text()
    why = r"auto, fine-tuning: 6 iterations, 1.5x the 0-iteration warmup or more"
    assert re.search(rf"initialised .*; lr0 0.00143 <- {why}", log)
    assert re.search(rf"initialised .*; warmup_bias_lr 0.0 <- {why}.*; momentum 0.9 <- {why}", log)
    assert re.search(rf"initialised .*; ema_floor 0.9 <- {why}", log)
    second_args = yaml.safe_load((tmp_path / "second/args.yaml").read_text())
    keys = ("lr0", "warmup_bias_lr", "momentum", "nominal_batch", "ema_floor")
    assert [second_args[k] for k in keys] == [0.00143, 0.0, 0.9, 64, 0.9]
    for name in ("stem.conv.weight", "down2.bn.weight", "down2.bn.bias"):  # frozen: still the --weights values
        assert torch.equal(second["model"][name], first["ema"][name]), name
    assert not torch.equal(second["model"]["stage2.cv1.conv.weight"], first["ema"]["stage2.cv1.conv.weight"])
    trainable = sum(
        1 for k in second["model"] if k.endswith(("weight", "bias")) and not k.startswith(("stem.", "down2."))
    )
    assert sum(len(g["params"]) for g in second["optimizer"]["param_groups"]) == trainable
    assert json.loads((tmp_path / "second/profile_trace.json").read_text())["traceEvents"]

    weights = ["--weights", one_epoch_run / "weights/last.pt", "--scratch-recipe"]  # and a scratch run's lr0
    result = run(["--data", tiny_data, "--benchmark", "2", *weights, "--out", tmp_path / "bench", *TINY])
    bench_args = yaml.safe_load((tmp_path / "bench/args.yaml").read_text())
    assert (bench_args["lr0"], bench_args["warmup_bias_lr"]) == (0.002, 0.1)
    assert re.search(r"benchmark: [0-9.]+ images/s", result.stdout)
    # its 3 + 2 iterations cross the end of epoch 1 (3 batches): training is timed, not a validation
    row = next(csv.DictReader(open(tmp_path / "bench/results.csv")))
    assert row["epoch"] == "1" and math.isnan(float(row["mAP50-95"]))
    assert not (tmp_path / "bench/weights/best.pt").exists()


def make_large_objects(root, n_train=16, n_val=8, size=320, seed=0):
    """Filled boxes and ellipses of a quarter to two thirds of the image on a dark noisy background:
    a set that a few epochs of training visibly learn."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for k in range(n):
            img = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
            rows = []
            for _ in range(rng.integers(1, 3)):
                w, h = (int(v) for v in rng.integers(size // 4, size * 2 // 3, 2))
                x, y = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
                cls, colour = int(rng.integers(0, 2)), tuple(int(c) for c in rng.integers(150, 256, 3))
                if cls == 0:
                    cv2.rectangle(img, (x, y), (x + w, y + h), colour, -1)
                else:
                    cv2.ellipse(img, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, colour, -1)
                rows.append(f"{cls} {(x + w / 2) / size:.5f} {(y + h / 2) / size:.5f} {w / size:.5f} {h / size:.5f}")
            cv2.imwrite(str(root / "images" / split / f"{k}.jpg"), img)
            (root / "labels" / split / f"{k}.txt").write_text("\n".join(rows) + "\n")
    cfg = root / "large.yaml"
    cfg.write_text("path: .\ntrain: images/train\nval: images/val\nnames: [box, ellipse]\n")
    return cfg


def test_amp_on_cpu_runs_the_model_in_bf16_the_loss_in_fp32_and_learns(tmp_path):
    """`--amp --device cpu` is bf16 autocast: every map the model returns is bf16, the loss is fp32, and the loss
    falls over a few steps on a small set. Sized for a CPU that emulates bf16 (AVX2 only: ~10x slower than fp32),
    where this run must still take seconds; a CPU without native bf16 is told so in one line, and trains on."""
    cfg = make_large_objects(tmp_path / "large", n_train=4, n_val=4, size=160)
    out, steps = tmp_path / "run", tmp_path / "steps.txt"
    wrapper = make_wrapper(
        tmp_path,
        loss=f"""
        result = original_loss(self, maps, targets)
        with open({str(steps)!r}, "a") as f:
            f.write(f"{{','.join(sorted({{str(m.dtype) for m in maps}}))}} {{result[0].dtype}} {{float(result[0])}}\\n")
        return result
        """,
        setup="import utils.distributed; utils.distributed.cpu_has_native_bf16 = lambda: False  # as on AVX2",
    )
    # no --workers: the default follows the machine's cores
    run(["--data", cfg, "--amp", "--device", "cpu", "--imgsz", "160", "--batch", "4", "--epochs", "12",
         "--mosaic", "0", "--close-mosaic", "0", "--accumulate", "1", "--warmup-epochs", "0", "--lr0", "0.01",
         # the same 4 images unaugmented at every step: the loss of a model that learns falls step by step
         "--fliplr", "0", "--hsv-h", "0", "--hsv-s", "0", "--hsv-v", "0", "--translate", "0", "--scale", "0",
         "--val-every", "12", "--out", out], wrapper=wrapper)  # fmt: skip
    log = (out / "train.log").read_text()
    assert "amp bfloat16" in log and "bf16 is emulated and about" in log
    assert yaml.safe_load((out / "args.yaml").read_text())["workers"] == min(8, len(os.sched_getaffinity(0)))
    rows = [line.rsplit(" ", 2) for line in steps.read_text().splitlines()]
    assert len(rows) == 12 and all(maps == "torch.bfloat16" for maps, _, _ in rows), rows
    assert all(dtype == "torch.float32" for _, dtype, _ in rows)
    losses = [float(loss) for _, _, loss in rows]
    assert sum(losses[-3:]) < 0.7 * sum(losses[:3]), losses


@pytest.mark.parametrize("imgsz", [416, 608])
def test_multi_scale_at_sizes_that_are_32_mod_64(tiny_data, tmp_path, imgsz):
    """--multi-scale --imgsz 416 used to crash at the first step (a size that was not a multiple of 32)."""
    sizes = make_wrapper(
        tmp_path,
        loss="""
        print("input size", maps[0].shape[-1] * 8, maps[0].shape[-2] * 8)
    """,
    )
    # 3 iterations of one image each: the sizes are the point; 3 images, not 6, halve the convolutions at 608-912 px
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "3", "--out", tmp_path / "run", *TINY]
    args[args.index("--imgsz") + 1], args[args.index("--batch") + 1] = str(imgsz), "1"
    result = run([*args, "--multi-scale", "--accumulate", "1"], wrapper=sizes)
    seen = [tuple(map(int, s)) for s in re.findall(r"input size (\d+) (\d+)", result.stdout)]
    assert len(seen) == 3 and all(
        w == h and w % 32 == 0 and imgsz // 2 - 32 < w <= imgsz * 3 // 2 + 32 for w, h in seen
    ), seen


def test_patience_single_cls_fraction_and_batch_minus_one_on_cpu(tiny_data, tmp_path):
    out = tmp_path / "run"
    args = [
        "--data",
        tiny_data,
        "--epochs",
        "8",
        "--patience",
        "2",
        "--single-cls",
        "--fraction",
        "0.5",
        "--out",
        out,
        *TINY,
    ]
    args[args.index("--batch") + 1] = "-1"
    result = run(args)
    output = result.stdout + result.stderr
    assert "--batch -1 measures free GPU memory and needs a CUDA device; using --batch 16" in output
    assert "6 train / 6 val images, 1 classes" in output  # --fraction 0.5 of 12; --single-cls
    assert "stopping early" in output
    rows = list(csv.DictReader(open(out / "results.csv")))
    last, best = load(out / "weights/last.pt"), load(out / "weights/best.pt")
    assert len(rows) == last["epoch"] == last["best_epoch"] + 2 < 8  # resume-safe: the best epoch is in last.pt
    assert best["names"] == ["object"] and best["nc"] == 1 and last["args"]["batch"] == 16
    result = run(
        ["val.py", "--weights", out / "weights/best.pt", "--workers", "0", "--out", tmp_path / "val"], check=False
    )
    assert result.returncode == 0, result.stderr[
        -2000:
    ]  # the checkpoint says single-cls: val.py merges the classes too
    assert [c["class"] for c in json.loads((tmp_path / "val/metrics.json").read_text())["per_class"]] == ["object"]


def test_resume_on_fewer_gpus_keeps_the_images_per_gpu_and_per_step(one_epoch_run, tmp_path):
    """A run saved on 2 processes of batch 2 each (--batch 4), resumed on one: each GPU keeps its 2 images (the
    total of 4 on one GPU ran out of memory, and the advised smaller --batch was refused by --resume), the
    accumulation doubles so that a step still sees 4 images, and the run goes on from the same images seen."""
    out = tmp_path / "run"
    shutil.copytree(one_epoch_run, out)  # --resume writes beside the last.pt it is given
    last = out / "weights/last.pt"
    state = load(last)
    state.update(epoch=0, iteration=2, world_size=2)  # 8 of the 12 images seen, on 2 processes
    state["args"]["epochs"] = 1  # the rest of that epoch: 2 iterations of 2 images
    torch.save(state, last)
    output = run(["--resume", last, "--workers", "0"]).stdout
    assert "resuming" in output and "at epoch 0, iteration 4" in output  # 8 images = 4 batches of 2
    assert "batch 2 x accumulate 2" in output
    resumed = load(last)
    assert (resumed["epoch"], resumed["args"]["batch"], resumed["args"]["accumulate"]) == (1, 2, 2)
    decay = next(g for g in resumed["optimizer"]["param_groups"] if g["name"] == "decay")
    assert resumed["args"]["nominal_batch"] == 4  # adamw: a step per batch of the original run, 4 images
    assert decay["weight_decay"] == pytest.approx(5e-4)  # scaled by the step's 4 images over those 4, as before

    # The advice of the out-of-memory message, --batch, is accepted by --resume (same number of processes).
    state.update(world_size=1)
    torch.save(state, last)
    output = run(["--resume", last, "--workers", "0", "--batch", "2"]).stdout
    assert "at epoch 0, iteration 4" in output and "batch 2 x accumulate 2" in output


def test_compile_trains_and_saves_plain_weights(tiny_data, tmp_path):
    """--compile wraps the model in torch.compile: last.pt must hold the plain model's names (a checkpoint with
    '_orig_mod.' keys loads nowhere else), best.pt the same. Inductor's C++ build takes minutes on 2 cores,
    so dynamo runs here with its 'eager' backend: the graph capture and the wrapper are what this checks."""
    wrapper = make_wrapper(
        tmp_path,
        setup="""
        original_compile = torch.compile
        def eager_compile(model, **kw):
            compiled.append(type(model).__name__)
            return original_compile(model, backend="eager")
        torch.compile = eager_compile
        compiled = []
        """,
    )
    wrapper.write_text(wrapper.read_text() + "assert compiled == ['YOLO'], compiled\n")
    out = tmp_path / "run"
    run(["--data", tiny_data, "--epochs", "1", "--subset", "4", "--compile", "--out", out, *TINY], wrapper=wrapper)
    state = load(out / "weights/last.pt")
    assert state["args"]["compile"] and not any(k.startswith("_orig_mod") for k in state["model"])
    assert state["model"].keys() == load(out / "weights/best.pt")["model"].keys()


def test_reg_max_1_trains_11n_without_dfl_and_its_checkpoint_rebuilds_that_network(tiny_data, tmp_path):
    """--reg-max 1 (the no-DFL ablation): 4 distances per anchor instead of 4 x 16 bins, the L1 term in place of DFL;
    val.py, detect.py and export.py (model_from_checkpoint), a resume and a fine-tune from the .pt rebuild it from the
    weights."""
    from models.weights import architecture, model_from_checkpoint
    from utils.checkpoints.ours import load_checkpoint

    tiny = [*TINY, "--model", "11n", "--val-every", "9"]  # the last --model wins: 11n
    run(["--data", tiny_data, "--epochs", "1", "--reg-max", "1", "--out", tmp_path / "nodfl", *tiny])
    last = load(tmp_path / "nodfl/weights/last.pt")
    assert last["model"]["head.box.0.2.weight"].shape[0] == 4 and last["args"]["reg_max"] == 1
    assert last["scale"] == "11n" and math.isfinite(json.loads((tmp_path / "nodfl/metrics.json").read_text())["mAP50"])
    model = model_from_checkpoint(last)
    assert model.head.reg_max == 1 and not model.end2end
    with torch.no_grad():
        assert model(torch.rand(1, 3, 64, 64)).shape == (1, 8 * 8 + 4 * 4 + 2 * 2, 4 + 6)  # per anchor, for NMS
    # a .pt as --model (or a resume) is its network, whatever --reg-max says; a scale takes --reg-max
    pt = tmp_path / "nodfl/weights/last.pt"
    assert architecture(str(pt), 0, init_ckpt=load_checkpoint(pt)) == ("11n", 1)
    assert architecture("n", 0, resume_ckpt=last) == ("11n", 1) and architecture("26n", 16) == ("26n", 16)
    result = run(["--data", tiny_data, "--reg-max", "-1", "--out", tmp_path / "x", *tiny], check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--reg-max -1: give 0 (the family's), 1 (no DFL) or the DFL bins per side (16)" in result.stderr
