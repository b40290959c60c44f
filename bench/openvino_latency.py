"""Median latency at batch 1 of OpenVINO IRs, ours and Ultralytics', timed the same way on the same input.

    python bench/openvino_latency.py runs/train/exp/weights/best_benchmark/best_openvino_model \
        runs/peer/yolov8n_openvino_model --runs 50

Each IR (a folder or its .xml) is compiled for the CPU with PERFORMANCE_HINT LATENCY twice: with
INFERENCE_PRECISION_HINT f32 (what this repo's utils/inference.py uses) and with the plugin's default (what
Ultralytics' AutoBackend uses: bf16 for float layers on CPUs with AVX512_BF16 or AMX). Prints the median of --runs
timed calls after 5 warm-up calls, on random input of the IR's own shape.
"""

import argparse
import time
from pathlib import Path

import numpy as np
import openvino as ov

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("models", nargs="+", help="OpenVINO folders or .xml files")
parser.add_argument("--runs", type=int, default=50)
args = parser.parse_args()

core = ov.Core()
print(f"{'model':<60} {'f32 ms':>8} {'default ms':>10} (the default's precision)")
for model in map(Path, args.models):
    xml = model if model.suffix == ".xml" else next(model.glob("*.xml"))
    network = core.read_model(str(xml))
    x = np.random.default_rng(0).random(tuple(network.inputs[0].shape), dtype=np.float32)
    figures = []
    for hint in ("f32", None):
        config = {"PERFORMANCE_HINT": "LATENCY", **({"INFERENCE_PRECISION_HINT": hint} if hint else {})}
        compiled = core.compile_model(network, "CPU", config)
        request = compiled.create_infer_request()
        for _ in range(5):
            request.infer({0: x})
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            request.infer({0: x})
            times.append(time.perf_counter() - start)
        figures.append(np.median(times) * 1000)
        default = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    print(f"{str(model)[-60:]:<60} {figures[0]:>8.1f} {figures[1]:>10.1f} ({default})")
