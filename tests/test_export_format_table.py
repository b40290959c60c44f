"""export.py's formats come from one table (utils/export/formats.py): a row added there is offered, benchmarked,
named and opened with nothing else; a format whose package is missing is one sentence with that format's pip line.
"""

import dataclasses
import importlib.util
import subprocess
import sys

import pytest
from calibrated_model import ROOT, make_checkpoint, one_thread  # noqa: F401 (one_thread: autouse fixture)
from runtimes import needs

import export
from utils.checkpoints.ours import CheckpointError
from utils.export import formats as export_formats
from utils.inference import load_exported


def test_every_format_comes_from_one_table(tmp_path, monkeypatch):
    """export.py's flags, what --benchmark writes, the file names and load_exported's dispatch all read
    utils/export_formats.FORMATS: a row added there is offered, benchmarked, named and opened with nothing else."""
    rows = export_formats.FORMATS
    # a file is told by its suffix, or by its own name where its format fixes it (saved_model.pb beside best.pb)
    assert len({row.name for row in rows}) == len({(row.suffix, row.file_name) for row in rows}) == len(rows)
    assert all(callable(row.write) and callable(row.load) and row.suffix.startswith(".") for row in rows)
    parsed = vars(export.parse_args([]))
    assert all(parsed[row.name] is False for row in rows)
    benchmark = export.jobs_of(export.parse_args(["--benchmark"]))
    assert {(row.name, p) for row, p in benchmark} <= {(row.name, p) for row in rows for p in row.benchmark}
    opened = []

    def load_npz(path, device):
        opened.append(path)
        return {"names": ["a"], "run": None, "imgsz": (64, 64), "stride": 32}

    new = export_formats.ExportFormat("npz", "NumPy", "NumPy", ".npz", write=print, load=load_npz, options=("half",))
    new = dataclasses.replace(new, benchmark=("fp32", "fp16"), refusal="is a test row")
    monkeypatch.setattr(export_formats, "FORMATS", (*rows, new))
    assert export.jobs_of(export.parse_args(["--npz", "--half"])) == [(new, "fp16")]  # its flag
    benchmark = export.jobs_of(export.parse_args(["--benchmark"]))
    assert [job for job in benchmark if job[0] is new] == [(new, "fp32"), (new, "fp16")]
    weights = tmp_path / "best.pt"
    assert export_formats.output_path(weights, new, "int8") == tmp_path / "best_int8.npz"
    with pytest.raises(SystemExit, match=r"^error: --npz is a test row; leave out --int8, --nms, --dynamic$"):
        export.check_request(export.parse_args(["--weights", str(make_checkpoint(weights)), "--npz", "--nms"]))
    path = tmp_path / "best.npz"
    path.write_bytes(b"")
    model = load_exported(path)
    assert opened == [path] and model.backend == "NumPy" and model.names == ["a"]
    other = tmp_path / "best.h5"
    other.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"must be a \.pt checkpoint, an \.onnx, .* or \.npz file or an Open"):
        load_exported(other)


@needs("openvino")  # the one OpenVINO note below: its int8 alone left out
def test_a_missing_package_is_one_sentence_with_the_pip_line_of_that_format(tmp_path, monkeypatch, capsys):
    """Each format names only its own packages (not requirements-export.txt, ~4 GB), looked up
    with importlib.util.find_spec before anything is loaded or written."""
    weights = make_checkpoint(tmp_path / "best.pt")
    find_spec, absent = importlib.util.find_spec, {"onnxruntime", "nncf", "litert_torch"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else find_spec(name, *a))
    expected = {
        "--onnx": "--onnx needs onnxruntime, which is not installed: pip install onnx onnxruntime",
        "--onnx --int8": "--onnx --int8 needs onnxruntime, which is not installed: pip install onnx onnxruntime",
        "--openvino --int8": "--openvino --int8 needs nncf, which is not installed: pip install onnx openvino nncf",
        "--tflite": "--tflite needs litert-torch, which is not installed: pip install litert-torch ai-edge-litert",
    }
    for flags, sentence in expected.items():
        with pytest.raises(SystemExit) as exit_info:
            export.main(["--weights", str(weights), *flags.split()])
        assert exit_info.value.code == f"error: {sentence}"  # a string: exit status 1, printed without a traceback
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # nothing written
    export.jobs_of(export.parse_args(["--benchmark"]))
    notes = capsys.readouterr().out.splitlines()
    note = "OpenVINO int8 needs nncf, which is not installed: pip install onnx openvino nncf"
    assert f"note: left out of the benchmark: {note}" in notes
    assert not any("OpenVINO fp32" in note for note in notes)
    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(b"")
    with pytest.raises(CheckpointError) as error:
        load_exported(onnx_file)
    sentence = f"{onnx_file} (an ONNX model) needs onnxruntime, which is not installed: pip install onnxruntime"
    assert str(error.value) == sentence
    monkeypatch.undo()
    done = subprocess.run(  # the command line: exit status 1, the one sentence, no traceback
        [sys.executable, "-c", "import sys; sys.modules['onnxruntime'] = None; import export; export.main()"]
        + ["--weights", str(weights)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"error: {expected['--onnx']}"], done.stderr
