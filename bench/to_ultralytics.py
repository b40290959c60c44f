"""One of this repo's YOLOv8 / YOLO11 checkpoints written as an Ultralytics one, so that both repos can fine-tune
the very same file side by side (bench/real_data_benchmark.py --weights). Runs in the peer environment
(bench/peer_env.sh DIR), never in this repo's: it builds Ultralytics' own DetectionModel and pickles it as
Ultralytics' trainer does.

    $PEER_PYTHON bench/to_ultralytics.py runs/train/exp/weights/best.pt shapes_yolov8n.pt

The weights are renamed by the inverse of utils/checkpoints/ultralytics.py's map (our module names -> model.<i>),
the DFL ramp is Ultralytics' own, and before it saves, the script checks that both networks give the same raw
outputs on a random image (fp32; the file then holds fp16, as Ultralytics' do). YOLO26 is refused: its one-to-one
head would need Ultralytics' end-to-end settings as well.
"""

import argparse
import sys
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this repo's models/ and utils/ (torch only) beside the peer's ultralytics

from bench.peer import use_peer_config  # noqa: E402

use_peer_config()  # before ultralytics is imported

import torch  # noqa: E402
from ultralytics import __version__  # noqa: E402
from ultralytics.nn.tasks import DetectionModel  # noqa: E402

from models.weights import model_from_checkpoint  # noqa: E402
from utils.checkpoints.ultralytics import LAYER_NAMES  # noqa: E402

YAML = {"": "yolov8{}.yaml", "11": "yolo11{}.yaml"}  # our model name's family prefix -> Ultralytics' model file


INDEX = {family: {name: i for i, name in names.items()} for family, names in LAYER_NAMES.items()}  # our name -> i


def their_name(family, ours):
    """head.box.0.1.conv.weight -> model.22.cv2.0.1.conv.weight: the inverse of our_weights' rename."""
    module, _, rest = ours.partition(".")
    index = INDEX[family][module]
    if module == "head":
        rest = rest.replace("box.", "cv2.", 1) if rest.startswith("box.") else rest.replace("cls.", "cv3.", 1)
    return f"model.{index}.{rest}"


def convert(source):
    """(Ultralytics' DetectionModel with our weights, the largest raw-output difference on a random image, the image
    size the checkpoint trained at)."""
    ours = model_from_checkpoint(str(source)).float().eval()
    family, scale = ours.scale[:-1], ours.scale[-1]
    if family not in YAML:
        sys.exit(f"{source}: model {ours.scale}; only YOLOv8 and YOLO11 checkpoints are written as Ultralytics ones")
    theirs = DetectionModel(YAML[family].format(scale), nc=ours.nc, verbose=False)
    state = theirs.state_dict()
    for key, tensor in ours.state_dict().items():
        name = their_name(family, key)
        if name not in state or state[name].shape != tensor.shape:
            sys.exit(f"{source}: {key} has no counterpart of shape {tuple(tensor.shape)} in {YAML[family]}")
        state[name] = tensor
    theirs.load_state_dict(state)
    theirs.names = dict(enumerate(ours.names))
    theirs.eval()
    x = torch.rand(1, 3, ours.imgsz, ours.imgsz)
    with torch.no_grad():  # ours: a (1, 64 + nc, h, w) map per level; theirs: {"boxes": (1, 64, A), "scores": ...}
        # the raw maps of each level (box bins, then class logits), as theirs answers them
        expected, got = torch.cat([m.flatten(2) for m in ours(x, mode="maps")], 2), theirs(x)[1]
    got = torch.cat((got["boxes"], got["scores"]), 1)
    return theirs, (expected - got).abs().max().item(), ours.imgsz


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="this repo's .pt (best.pt or last.pt of a YOLOv8 / YOLO11 run)")
    parser.add_argument("out", help="the Ultralytics .pt to write")
    args = parser.parse_args()
    model, diff, imgsz = convert(args.source)
    if diff > 1e-3:
        sys.exit(f"{args.source}: Ultralytics' network answers differently (largest raw difference {diff:.2g})")
    ckpt = {"date": datetime.now().isoformat(), "version": __version__, "epoch": -1, "best_fitness": None}
    ckpt |= {"model": None, "ema": model.half(), "updates": 0, "optimizer": None}
    ckpt["train_args"] = {"imgsz": imgsz, "task": "detect", "model": f"{Path(args.source).name} (converted)"}
    torch.save(ckpt, args.out)
    print(f"{args.out}: {args.source} as Ultralytics {__version__}'s {model.yaml['yaml_file']}, {len(model.names)}"
          f" classes; raw outputs agree to {diff:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
