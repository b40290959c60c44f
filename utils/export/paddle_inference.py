"""PaddlePaddle inference models (Paddle Inference, Paddle Serving, FastDeploy), written and opened like the rows of
utils/export/formats.py's other formats.

x2paddle converts the traced network to Paddle's static graph; the folder export.py writes (best_paddle_model/)
holds its best.json (the program) and best.pdiparams (the weights), with metadata.json beside them. Paddle's CPU
runtime is run without oneDNN: its oneDNN kernels could not run the converted graph (an attribute of the resize
they do not take), and the plain kernels give PyTorch's outputs to 1e-4.
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from utils.checkpoints.ours import CheckpointError
from utils.export.loaders import METADATA_FILE, any_batch, export_metadata, first_line, parse_metadata
from utils.export.mobile import outside_topk, per_anchor
from utils.export.writers import ExportError, float_copy

os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ logs a line per pass unless told otherwise


def write_paddle(module, x, path, options, metadata, calibration):
    from x2paddle.convert import pytorch2paddle

    # per_anchor: x2paddle's graph holds no TopK of the end-to-end head's kind; the loader picks the best 300
    module, x = per_anchor(float_copy(module), metadata), x.float().cpu().contiguous()
    with torch.no_grad():
        output = list(module(x).shape)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
                warnings.simplefilter("ignore")
                pytorch2paddle(module=module, save_dir=scratch, jit_type="trace", input_examples=[x])
        except Exception as e:
            raise ExportError(
                f"x2paddle could not convert the network ({first_line(e)}); export --onnx instead"
            ) from None
        converted = Path(scratch) / "inference_model"
        program = next(iter(sorted(converted.glob("model.json")) + sorted(converted.glob("model.pdmodel"))), None)
        if program is None:
            raise ExportError("x2paddle wrote no inference model; export --onnx instead")
        shutil.move(program, path.with_name(path.stem + program.suffix))
        shutil.move(converted / "model.pdiparams", path)
    metadata.update(input_names=["x0"], output_names=["output"], input_shapes=[list(x.shape)], output_shapes=[output])
    (path.parent / METADATA_FILE).write_text(json.dumps(export_metadata(**metadata)))


def load_paddle(path, device):
    """A Paddle folder (export.py writes best_paddle_model/best.json, best.pdiparams, metadata.json) or its
    .pdiparams."""
    params = path if path.suffix == ".pdiparams" else next(iter(sorted(path.glob("*.pdiparams"))), None)
    program = params and next(iter(sorted(params.parent.glob(f"{params.stem}.json"))), None)
    if program is None:
        raise CheckpointError(
            f"{path} holds no Paddle inference model (.json and .pdiparams); export one with export.py"
        )
    try:
        strings = json.loads((params.parent / METADATA_FILE).read_text())
    except (OSError, ValueError):
        strings = {}
    meta = parse_metadata(strings, path)
    try:
        run_array = paddle_predictor(program, params, torch.get_num_threads())
    except Exception as e:
        raise CheckpointError(f"{path} is not a Paddle model this Paddle can load ({first_line(e)})") from None

    def run_batch(x):
        return torch.from_numpy(run_array(x.detach().float().cpu().contiguous().numpy())).float()

    return {**meta, "run": outside_topk(any_batch(run_batch, meta["batch"]), meta), "device": torch.device("cpu")}


def paddle_predictor(program, params, threads):
    """run(array) -> its first output as an array, by Paddle Inference's CPU predictor of a program (.json or
    .pdmodel) and its weights (.pdiparams), oneDNN off (see the module's docstring)."""
    import paddle.inference

    config = paddle.inference.Config(str(program), str(params))
    config.disable_gpu()
    config.disable_mkldnn()
    config.set_cpu_math_library_num_threads(threads)
    config.disable_glog_info()
    predictor = paddle.inference.create_predictor(config)
    model_input = predictor.get_input_handle(predictor.get_input_names()[0])
    model_output = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(x):
        model_input.copy_from_cpu(x)
        predictor.run()
        return model_output.copy_to_cpu()

    return run
