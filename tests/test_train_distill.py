"""train.py --teacher (issue 66): a trained model's class scores teach the one that trains. The term is a loss part
of its own (results.csv's distill_loss), 0 for a student that scores as its teacher does; a run with a teacher
resumes bitwise, and refuses a teacher file changed since; each bad teacher gets one sentence before any step."""

import csv
import shutil

import pytest
import torch
from train_runs import NAMES, TINY, load, make_checkpoint, make_wrapper, run, tensors_equal

from models.teacher import file_sha256, load_teacher
from models.yolo import YOLO
from utils import distributed
from utils.distributed import teacher_dtype_for
from utils.loss import DetectionLoss


def rows(run_dir):
    with open(run_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def test_a_teacher_adds_the_distill_part_while_fine_tuning(tiny_data, tmp_path):
    """--teacher with --weights: results.csv and the log carry the term, last.pt names the teacher file and its
    hash but holds none of its tensors; the validation has no teacher and so no val_distill_loss column."""
    teacher = make_checkpoint(tmp_path / "teacher.pt")
    student = make_checkpoint(tmp_path / "student.pt", scale="n", seed=2)
    out = tmp_path / "run"
    run(
        [
            "--data",
            tiny_data,
            "--epochs",
            "1",
            "--subset",
            "4",
            "--weights",
            student,
            "--teacher",
            teacher,
            *TINY,
            "--out",
            out,
        ]
    )
    (row,) = rows(out)
    assert float(row["distill_loss"]) > 0 and "val_distill_loss" not in row
    log = (out / "train.log").read_text()
    assert f"teacher {teacher}, distill gain 0.5" in log and "initialised" in log and " distill " in log
    last = load(out / "weights/last.pt")
    assert last["teacher"] == {"path": str(teacher), "sha256": file_sha256(teacher), "scale": "s"}
    assert sum(t.numel() for t in last["model"].values()) == sum(t.numel() for t in YOLO("n", 6).state_dict().values())


def test_a_run_with_a_teacher_resumes_bitwise_and_refuses_a_changed_teacher(tiny_data, tmp_path):
    teacher = make_checkpoint(tmp_path / "teacher.pt")
    common = ["--data", tiny_data, "--epochs", "2", "--subset", "8", "--deterministic", "--accumulate", "1"]
    common += ["--val-every", "2", "--teacher", teacher, *TINY]
    run([*common, "--out", tmp_path / "straight"])
    stop = make_wrapper(
        tmp_path, loss="if n == 3:  # epoch 2's first step: a pre-emption\n    os.kill(os.getpid(), signal.SIGTERM)"
    )
    out = tmp_path / "stopped"
    run([*common, "--out", out], wrapper=stop)
    assert (load(out / "weights/last.pt")["epoch"], load(out / "weights/last.pt")["iteration"]) == (1, 1)

    shutil.copy(teacher, tmp_path / "original.pt")
    make_checkpoint(teacher, seed=3)  # another teacher under the same name
    refused = run(["--resume", out / "weights/last.pt", "--workers", "0"], check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    last_line = refused.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"error: --resume: the teacher {teacher} has changed since the run started")

    shutil.copy(tmp_path / "original.pt", teacher)
    run(["--resume", out / "weights/last.pt", "--workers", "0"])
    straight, resumed = load(tmp_path / "straight/weights/last.pt"), load(out / "weights/last.pt")
    for key in ("model", "ema", "optimizer", "ema_updates", "teacher"):
        assert tensors_equal(straight[key], resumed[key]), key
    assert [r["distill_loss"] for r in rows(out)] == [r["distill_loss"] for r in rows(tmp_path / "straight")]


def test_a_teacher_for_other_classes_stops_train_py_before_the_first_step(tiny_data, tmp_path):
    teacher = make_checkpoint(tmp_path / "dogs.pt", names=["dog", "cat"])
    out = tmp_path / "run"
    result = run(["--data", tiny_data, "--epochs", "1", "--teacher", teacher, *TINY, "--out", out], check=False)
    last_line = result.stderr.strip().splitlines()[-1]  # after the label verification's progress bars
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert last_line.startswith(f"error: --teacher {teacher} was trained on the classes ['dog', 'cat'], the")
    assert not (out / "weights/last.pt").exists() and not (out / "results.csv").exists()


@pytest.mark.parametrize(
    "case, words",
    [
        ("names", "was trained on the classes ['a', 'b', 'c', 'd', 'e', 'f'], the dataset has ['circle'"),
        ("imgsz", "was trained at 128 px and this run trains at --imgsz 64: its scores at another size"),
        ("missing", "does not exist; give a trained .pt"),
        ("corrupt", "is not a checkpoint this repo can read"),
        ("onnx", "is an exported ONNX model, which cannot teach"),
    ],
)
def test_each_bad_teacher_is_one_sentence_naming_it(tmp_path, case, words):
    path = tmp_path / ("teacher.onnx" if case == "onnx" else "teacher.pt")
    if case in ("names", "imgsz"):
        make_checkpoint(
            path, scale="n", names=list("abcdef") if case == "names" else NAMES, imgsz=128 if case == "imgsz" else 64
        )
    elif case in ("corrupt", "onnx"):
        path.write_bytes(b"\x00not a model" * 10)
    with pytest.raises(ValueError) as refused:
        load_teacher(str(path), NAMES, 64, torch.device("cpu"))
    message = str(refused.value)
    assert message.startswith("--teacher") and str(path) in message and words in message and "\n" not in message


def student_and_teacher_maps(student_scale, teacher_path, dtype=None):
    """The maps of a student in eval (BatchNorm from its running statistics, as the teacher's) and of the teacher
    loaded as train.py loads it, on the same images."""
    teacher, _ = load_teacher(str(teacher_path), NAMES, 64, torch.device("cpu"), dtype)
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.random.fork_rng():
        torch.manual_seed(1)
        student = YOLO(student_scale, len(NAMES)).eval()
    with torch.no_grad():
        return student, student(images, mode="maps"), teacher(images.to(dtype or torch.float32), mode="maps")


def test_a_teacher_identical_to_the_student_teaches_nothing(tmp_path):
    """The same weights, fused and read back as a teacher: the distillation part is 0 up to rounding; another
    teacher's is not. Without a teacher (the validation) the part is 0 and the first three are as before."""
    targets = torch.tensor([[0.0, 1, 8, 8, 40, 40], [1, 2, 20, 4, 60, 30]])
    student, maps, same = student_and_teacher_maps("n", make_checkpoint(tmp_path / "same.pt", scale="n", seed=1))
    loss_fn = DetectionLoss(student.head, distill_gain=0.5)
    assert loss_fn.names == ("box", "cls", "dfl", "distill") and loss_fn.columns[-1] == "distill_loss"
    assert loss_fn.val_columns == ("val_box_loss", "val_cls_loss", "val_dfl_loss")
    _, parts = loss_fn(maps, targets, same)
    assert 0 <= parts[3] < 1e-5 * parts[1]
    _, other = student_and_teacher_maps("n", make_checkpoint(tmp_path / "s.pt", seed=5, opinions=True))[1:]
    _, parts_other = loss_fn(maps, targets, other)
    assert parts_other[3] > 1e-3 and torch.equal(parts_other[:3], parts[:3])
    _, without = loss_fn(maps, targets)
    assert without[3] == 0 and torch.equal(without[:3], DetectionLoss(student.head)(maps, targets)[1])


def test_a_dfl_teacher_teaches_a_yolo26_student_its_class_scores(tmp_path):
    """YOLO26n has no DFL bins and two heads: the teacher's class logits (a YOLOv8s with DFL) teach its one-to-many
    branch; the gradient reaches that branch's class convs and not the one-to-one head's."""
    teacher = make_checkpoint(tmp_path / "s.pt", scale="s")
    student, maps, teacher_maps = student_and_teacher_maps("26n", teacher, torch.bfloat16)
    student.train()
    maps = student(torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    loss_fn = DetectionLoss(student.head, cls_gain=0, box_gain=0, dfl_gain=0, distill_gain=1.0)
    total, parts = loss_fn(maps, torch.zeros(0, 6), teacher_maps)
    assert loss_fn.names[2:] == ("l1", "distill") and parts[3] > 0 and torch.isfinite(parts).all()
    total.backward()
    assert student.head.cls[0][2].weight.grad.abs().sum() > 0
    assert (
        student.head.one2one_cls[0][2].weight.grad is None
        or student.head.one2one_cls[0][2].weight.grad.abs().sum() == 0
    )


def test_the_teacher_runs_in_bf16_where_the_cpu_computes_it_and_teaches_what_it_does_in_fp32(tmp_path, monkeypatch):
    """An fp32 run on a CPU with native bf16 (AMX, AVX512_BF16) runs its teacher in bf16, a third of the fp32 forward's
    time there (bench/RESULTS.md "Distillation"); under AMP the teacher takes the run's dtype; elsewhere fp32. The
    distillation term a bf16 teacher gives is the fp32 teacher's within 2%, its gradient within 5%."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: True)
    assert teacher_dtype_for(cpu, False, torch.bfloat16) == torch.bfloat16
    assert teacher_dtype_for(cuda, False, torch.float16) == torch.float32  # AMP is CUDA's default: its dtype then
    assert teacher_dtype_for(cuda, True, torch.float16) == torch.float16
    monkeypatch.setattr(distributed, "cpu_has_native_bf16", lambda: False)  # emulated bf16 is slower than fp32
    assert teacher_dtype_for(cpu, False, torch.bfloat16) == torch.float32
    assert teacher_dtype_for(cpu, True, torch.bfloat16) == torch.bfloat16  # --amp: the student's dtype, asked for
    teacher = make_checkpoint(tmp_path / "s.pt", seed=5, opinions=True)
    targets = torch.tensor([[0.0, 1, 8, 8, 40, 40], [1, 2, 20, 4, 60, 30]])
    terms, gradients = [], []
    for dtype in (torch.float32, torch.bfloat16):
        student, _, teacher_maps = student_and_teacher_maps("n", teacher, dtype)
        student.train()
        maps = student(torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
        loss_fn = DetectionLoss(student.head, cls_gain=0, box_gain=0, dfl_gain=0, distill_gain=1.0)
        total, parts = loss_fn(maps, targets, teacher_maps)
        total.backward()
        terms.append(parts[3])
        gradients.append(student.head.cls[0][2].weight.grad.clone())
    assert terms[0] > 1e-3 and torch.isclose(terms[1], terms[0], rtol=0.02), terms
    assert (gradients[1] - gradients[0]).norm() < 0.05 * gradients[0].norm()
