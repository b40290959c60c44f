"""Which INT8 calibration holds on models trained on other data: export.py --int8 (ONNX Runtime, OpenVINO) of each
checkpoint under each variant, scored by export.py's own gate (pycocotools on the val split). A probe: its figures
are in RESULTS.md ("INT8 on models trained on other data"), the script left when they were taken.

    python bench/int8_calibration.py --weights A/best.pt B/best.pt --data A.yaml B.yaml
        --variants default percentile stem-float percentile-stem-float default-ov stem-float-ov

Variants: `default` is what export.py does; `percentile`: ONNX Runtime's percentile calibration instead of min-max;
`stem-float`: the stem convolution also left in float (KEEP_FLOAT); `-ov`: OpenVINO (NNCF) instead of ONNX Runtime.
"""

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import onnxruntime.quantization as quantization  # noqa: E402

import export  # noqa: E402
from utils.export import writers  # noqa: E402

STEM = r"^/stem/"


def export_variant(weights, data, variant, folder):
    """The gate's line of the INT8 file that export.py writes from `weights` under `variant`."""
    original, keep_float = quantization.quantize_static, list(writers.KEEP_FLOAT)

    def quantize(*args, **kwargs):
        if "percentile" in variant:
            kwargs["calibrate_method"] = quantization.CalibrationMethod.Percentile
        return original(*args, **kwargs)

    quantization.quantize_static = quantize
    writers.KEEP_FLOAT[:] = keep_float + ([STEM] if "stem-float" in variant else [])
    copy = folder / "best.pt"
    shutil.copy(weights, copy)
    fmt = "--openvino" if variant.endswith("-ov") else "--onnx"
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            export.main(["--weights", str(copy), fmt, "--int8", "--data", data, "--runs", "1", "--max-map-drop", "1"])
    except SystemExit as e:
        print(e.code, file=printed)
    finally:
        quantization.quantize_static, writers.KEEP_FLOAT[:] = original, keep_float
    gate = [line.strip() for line in printed.getvalue().splitlines() if "mAP50-95" in line]
    return gate[-1] if gate else printed.getvalue()[-400:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", nargs="+", required=True)
    parser.add_argument("--data", nargs="+", required=True, help="one dataset yaml per --weights")
    parser.add_argument("--variants", nargs="+", default=["default", "default-ov"])
    args = parser.parse_args()
    for weights, data in zip(args.weights, args.data, strict=True):
        for variant in args.variants:
            with tempfile.TemporaryDirectory() as folder:
                print(f"{weights} {variant}: {export_variant(weights, data, variant, Path(folder))}", flush=True)


if __name__ == "__main__":
    main()
