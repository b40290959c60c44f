"""One Ultralytics checkpoint exported by both repos in every format both have: each file run in the same runtime
on this CPU, timed, and scored by pycocotools on the same validation images through one scorer (export.py's gate:
the same letterbox, NMS and ground truth, so the figure is the file's own), one table. Ultralytics' own val of its
file (its detections scored by bench/score_detections.py against the same ground truth) is a column too.

    PEER_PYTHON=peer-venv/bin/python python bench/export_side_by_side.py \
        --weights runs/real_suite/microcontrollers/peer-v8n/320px/e20/s0/peer/train/weights/best.pt \
        --data runs/real_suite/microcontrollers/data/yolo.yaml --imgsz 320

The peer environment needs the formats' packages too (pnnx ncnn MNN executorch litert-torch ai-edge-litert;
paddlepaddle<3.3 x2paddle six for Paddle; for
TensorFlow: tensorflow-cpu<=2.19 tf_keras<=2.19 onnx2tf<1.29 sng4onnx onnx_graphsurgeon, Ultralytics' own pins).
Latency: the median of --runs calls of the bare network, batch 1, the two files' calls interleaved (a load that
drifts slows both alike), in the format's runtime with the same settings for both files (ONNX Runtime's defaults;
OpenVINO LATENCY in f32; NCNN in fp32; 2 threads everywhere), so that the figure is the file's, not either repo's
wrapper. Each cell is kept in OUT/cells.json: a rerun skips what is done (--retime times the files again).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/export_side_by_side.py`: find utils/

from peer import find_peer_python  # noqa: E402
from score_detections import score  # noqa: E402

from utils.export.formats import by_name, file_size, output_path  # noqa: E402
from utils.export.paddle_inference import paddle_predictor  # noqa: E402

# our flag -> Ultralytics' format name
SHARED = {
    "torchscript": "torchscript",
    "onnx": "onnx",
    "openvino": "openvino",
    "tflite": "litert",
    "ncnn": "ncnn",
    "mnn": "mnn",
    "executorch": "executorch",
    "saved_model": "saved_model",
    "pb": "pb",
    "paddle": "paddle",
}
THREADS = 2


def runner(path, fmt):
    """run(x) of the bare network in an exported file (ours or theirs), x a float32 array (1, 3, h, w) -> its first
    output as an array (ours: (1, anchors, 4 + nc) xyxy; Ultralytics': (1, 4 + nc, anchors) xywh)."""
    run = bare_runner(path, fmt)

    def run_first(x):
        output = first(run(x))
        return output.astype(np.float32).reshape(1, *output.shape[-2:])  # NCNN's has no batch axis

    return run_first


def first(output):
    """The first output of whatever a runtime returns (a tensor, an array, a list, OpenVINO's dict, NCNN's pair)."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], int):  # NCNN: (status, Mat)
        return np.array(output[1])
    if hasattr(output, "values") and not hasattr(output, "shape"):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        output = output[0]
    return output.detach().numpy() if isinstance(output, torch.Tensor) else np.asarray(output)


def bare_runner(path, fmt):
    path = Path(path)
    if fmt == "torchscript":
        module = torch.jit.load(str(path))
        return lambda x: module(torch.from_numpy(x))
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})
    if fmt == "openvino":
        import openvino

        xml = path if path.suffix == ".xml" else next(path.glob("*.xml"))
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        request = openvino.Core().compile_model(str(xml), "CPU", config).create_infer_request()
        return lambda x: request.infer({0: x})
    if fmt == "ncnn":
        import ncnn

        param = path if path.suffix == ".param" else next(path.glob("*.param"))
        net = ncnn.Net()
        net.opt.num_threads = THREADS
        for option in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
            setattr(net.opt, option, False)
        net.load_param(str(param))
        net.load_model(str(param.with_suffix(".bin")))

        def run(x):
            extractor = net.create_extractor()
            extractor.input("in0", ncnn.Mat(np.ascontiguousarray(x[0])).clone())
            return extractor.extract("out0")

        return run
    if fmt == "mnn":
        import MNN

        manager = MNN.nn.create_runtime_manager(({"precision": "high", "backend": "CPU", "numThread": THREADS},))
        net = MNN.nn.load_module_from_file(str(path), [], [], runtime_manager=manager, rearrange=False)
        return lambda x: net.forward(MNN.expr.const(x, x.shape, MNN.expr.NCHW)).read()
    if fmt == "executorch":
        from executorch.runtime import Runtime

        pte = path if path.suffix == ".pte" else next(path.glob("*.pte"))
        method = Runtime.get().load_program(str(pte)).load_method("forward")
        return lambda x: method.execute([torch.from_numpy(x)])
    if fmt == "tflite":
        return tflite_runner(path)
    if fmt in ("saved_model", "pb"):
        return tensorflow_runner(path, fmt)
    if fmt == "paddle":
        return paddle_runner(path)
    raise ValueError(fmt)


def paddle_runner(path):
    """A Paddle inference model (ours: best.json; Ultralytics': x2paddle's inference_model/model.json or .pdmodel) with
    the predictor settings export.py's loader uses."""
    params = path if path.suffix == ".pdiparams" else sorted(path.rglob("*.pdiparams"))[0]
    program = next(p for p in (params.with_suffix(".json"), params.with_suffix(".pdmodel")) if p.exists())
    return paddle_predictor(program, params, THREADS)


def tensorflow_runner(path, fmt):
    """A SavedModel's serving signature, or a frozen GraphDef pruned from its placeholder to its last op; Ultralytics'
    graphs take NHWC input, ours NCHW (the transpose is inside ours)."""
    import tensorflow as tf

    if fmt == "saved_model":
        folder = path if path.is_dir() else path.parent
        loaded = tf.saved_model.load(str(folder))
        serve = loaded.signatures["serving_default"]
        name, spec = next(iter(serve.structured_input_signature[1].items()))
        call = lambda x: next(iter(serve(**{name: tf.constant(x)}).values()))  # noqa: E731
        call.kept = loaded  # the signature's variables live as long as the object it was loaded as
        shape = spec.shape.as_list()
    else:
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(path.read_bytes())
        placeholder = next(node for node in graph_def.node if node.op == "Placeholder")
        consumed = {i.split(":")[0].lstrip("^") for node in graph_def.node for i in node.input}
        last = [n for n in graph_def.node if n.name not in consumed and n.op not in ("Const", "NoOp")][-1]
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        call = wrapped.prune(
            wrapped.graph.as_graph_element(f"{placeholder.name}:0"), wrapped.graph.as_graph_element(f"{last.name}:0")
        )
        shape = [d.size for d in placeholder.attr["shape"].shape.dim]

    def run(x):
        if shape[1] != x.shape[1]:  # an NHWC graph (Ultralytics')
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        return call(tf.constant(x)).numpy()

    return run


def tflite_runner(path):
    """A .tflite file's interpreter; Ultralytics' graph takes NHWC input, ours NCHW."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=THREADS)
    interpreter.allocate_tensors()
    model_input, model_output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]

    def run(x):
        if list(model_input["shape"]) != list(x.shape):  # an NHWC graph (Ultralytics')
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        interpreter.set_tensor(model_input["index"], x)
        interpreter.invoke()
        return interpreter.get_tensor(model_output["index"])

    return run


def paired_latency(paths, fmt, imgsz, runs):
    """Median ms of each file's bare network, the files' calls interleaved so that a machine whose load drifts slows
    both alike, in turns (a, b, b, a, ...): the file called second ran about 2% faster or slower by its place alone."""
    runs_of = [runner(path, fmt) for path in paths]
    x = np.random.default_rng(0).random((1, 3, imgsz, imgsz), dtype=np.float32)
    times = [[] for _ in paths]
    for i in range(runs + 3):
        turn = list(zip(runs_of, times))
        for run, kept in turn[::-1] if i % 2 else turn:
            start = time.perf_counter()
            run(x)
            if i >= 3:  # the first calls allocate and pick kernels
                kept.append(time.perf_counter() - start)
    return [float(np.median(t) * 1000) for t in times]


def scorer(data):
    """export.py's gate scorer over the val split: the same letterbox, NMS (conf 0.001, IoU 0.7) and pycocotools."""
    from utils.data.dataset_yaml import load_dataset_yaml
    from utils.export.gate import Scores

    settings = argparse.Namespace(val_images=0, batch_val=1, workers=0)
    return Scores(load_dataset_yaml(data), {}, settings, torch.device("cpu"))


def same_scorer_map(path, fmt, imgsz, scores, ultralytics_layout):
    """(mAP50-95, mAP50) of a file's bare network through `scores`; Ultralytics' (1, 4 + nc, anchors) xywh output
    turned into ours, (1, anchors, 4 + nc) xyxy, first."""
    run = runner(path, fmt)

    def run_batch(x):
        out = torch.from_numpy(run(x.numpy()))
        if ultralytics_layout:
            out = out.transpose(1, 2)
            if fmt == "tflite":  # Ultralytics' LiteRT file: boxes as fractions of the input (its TF graphs: pixels)
                out[..., :4] *= imgsz
            xy, wh = out[..., :2], out[..., 2:4]
            out = torch.cat((xy - wh / 2, xy + wh / 2, out[..., 4:]), 2)
        return out

    from utils.inference import Predictor

    model = Predictor(run_batch, scores.names, (imgsz, imgsz), 32, dynamic=False, backend=fmt)
    return scores(model, (imgsz, imgsz))


def ours(weights, data, fmt, imgsz, out):
    """Our export of the checkpoint (export.py, its check and gate included) and val.py's mAP of the file."""
    folder = out / "ours"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "best.pt"
    shutil.copy(weights, copy)
    common = ["--data", str(data)]
    done = subprocess.run(
        [
            sys.executable,
            "export.py",
            "--weights",
            str(copy),
            f"--{fmt.replace('_', '-')}",
            "--imgsz",
            str(imgsz),
            "--runs",
            "1",
            *common,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    path = output_path(copy, by_name(fmt), "fp32")
    path = path.parent if by_name(fmt).folder else path
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {"file": str(path)}


def theirs(weights, data, fmt, imgsz, out, peer):
    done = subprocess.run(
        [peer, "bench/ultralytics_export.py", "--weights", str(weights), "--data", str(data)]
        + ["--format", SHARED[fmt], "--imgsz", str(imgsz), "--out", str(out / "theirs" / fmt)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    result = json.loads(lines[-1])
    if "error" in result:
        return result
    if "predictions" not in result:  # exported, then its own val died (TensorFlow's SavedModel: a segfault here)
        return {**result, "own_error": f"its own val exited with status {done.returncode}"}
    map5095, map50, *_ = score(data, result["predictions"], category_offset=1)
    return {"file": result["file"], "own_map": map5095, "own_map50": map50}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="an Ultralytics .pt")
    parser.add_argument("--data", required=True, help="its dataset yaml (absolute path: inside)")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--formats", nargs="+", default=list(SHARED), choices=list(SHARED))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--retime", action="store_true", help="time the files again (kept: exports and scores)")
    parser.add_argument("--out", default="runs/export_side_by_side")
    parser.add_argument("--peer-python", default="", help="the peer environment's python (default: $PEER_PYTHON)")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    peer = find_peer_python(args.peer_python)
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cells_file = out / "cells.json"
    cells = json.loads(cells_file.read_text()) if cells_file.exists() else {}
    scores = scorer(Path(args.data).resolve())
    for fmt in args.formats:
        for side, make in (("ours", ours), ("theirs", theirs)):
            key = f"{fmt}/{side}"
            if key in cells:
                continue
            extra = (peer,) if side == "theirs" else ()
            cell = make(Path(args.weights).resolve(), Path(args.data).resolve(), fmt, args.imgsz, out, *extra)
            if "file" in cell:
                layout = side == "theirs"
                cell["map"], cell["map50"] = same_scorer_map(cell["file"], fmt, args.imgsz, scores, layout)
                cell["mb"] = file_size_any(cell["file"]) / 1e6
            cells[key] = cell
            cells_file.write_text(json.dumps(cells, indent=1))
            print(key, cell, flush=True)
        pair = [cells[f"{fmt}/{side}"] for side in ("ours", "theirs")]
        if all("file" in cell for cell in pair) and (args.retime or not all("ms" in cell for cell in pair)):
            for cell, ms in zip(pair, paired_latency([c["file"] for c in pair], fmt, args.imgsz, args.runs)):
                cell["ms"] = ms
            cells_file.write_text(json.dumps(cells, indent=1))
    print_table(cells, args.formats)


def file_size_any(path):
    path = Path(path)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else file_size(path)


def print_table(cells, formats):
    print(
        "\n| format | ours mAP50-95 / mAP50 | Ultralytics' file, same scorer | Ultralytics' own val of its file "
        "| ours ms | Ultralytics ms | MB ours / theirs |"
    )
    print("|---|---|---|---|---|---|---|")
    for fmt in formats:
        a, b = cells.get(f"{fmt}/ours", {}), cells.get(f"{fmt}/theirs", {})

        def figures(cell, key="map"):
            if key in cell:
                return f"{cell[key]:.4f} / {cell[key + '50']:.4f}"
            return f"fails: {cell.get('error') or cell.get('own_error', '?')}"

        ms = lambda c: f"{c['ms']:.1f}" if "ms" in c else "-"  # noqa: E731
        size = f"{a.get('mb', 0):.1f} / {b.get('mb', 0):.1f}"
        row = [by_name(fmt).title, figures(a), figures(b), figures(b, "own_map"), ms(a), ms(b), size]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    main()
