"""Proof that an Ultralytics checkpoint read by this repo (utils/checkpoints/ultralytics.py) is the same network:
the same raw outputs, the same detect.py boxes and the same val.py mAP as Ultralytics itself gives.

Run with the peer environment's Python (ultralytics installed there, never in this repo's; `bench/peer_env.sh DIR`
makes it, then `export PEER_PYTHON=DIR/bin/python`), from the repository root; this repo's side runs in its own
environment (--repo-python), as a user would run it:

    $PEER_PYTHON bench/ultralytics_equality.py \\
        --weights runs/peer/yolov8n/train/weights/best.pt runs/peer/yolo11n/train/weights/best.pt \\
        --data data/shapes.yaml --imgsz 256 --out runs/equality

Per checkpoint it prints and writes to OUT/equality.json:
- raw: the largest absolute difference of the head's maps before decoding and of the eval-mode outputs (boxes in
  input pixels, class probabilities; YOLO26: both branches' maps, and the final detections of the one-to-one head,
  which Ultralytics gives with `end2end = True`, its `nms=False`) on a fixed random batch, fp32, unfused model;
- detect: detect.py against Ultralytics' predict on the first --images val images (square letterbox on both
  sides, conf 0.25, IoU 0.7): boxes per side, boxes matched one to one, the largest corner difference in pixels;
- val: mAP50-95 / mAP50 of val.py against Ultralytics' validator on the val split (conf 0.001, IoU 0.7), both
  scored by pycocotools (its detections through bench/score_detections.py), and its own metric for reference.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ours_raw(weights, inputs, out):
    """This repo's side of the raw comparison (run in this repo's environment): the head's maps before
    decoding (box distributions, class logits; YOLO26: of both branches, one-to-many then one-to-one) and the
    model's output (YOLO26: its final detections), as model_from_checkpoint returns the model (channels_last)
    and in the default memory layout."""
    sys.path.insert(0, str(REPO))
    import torch

    from models.weights import model_from_checkpoint

    model, x, result = model_from_checkpoint(weights).float(), torch.load(inputs, weights_only=True), {}
    for layout in ("channels_last", "contiguous"):
        if layout == "contiguous":
            model.to(memory_format=torch.contiguous_format)
        with torch.no_grad():
            result[f"decoded_{layout}"], maps = model(x), model(x, mode="maps")
        branches = [maps["one2many"], maps["one2one"]] if model.end2end else [maps]
        result[f"raw_{layout}"] = torch.cat([torch.cat([m.flatten(2) for m in b], 2) for b in branches], 1)
    torch.save(result, out)


def run(cmd):
    cmd = [str(c) for c in cmd]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout + result.stderr


def box_iou(a, b):
    import torch

    lt, rb = torch.max(a[:, None, :2], b[None, :, :2]), torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area = lambda x: (x[:, 2:] - x[:, :2]).prod(1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", default=[], help="Ultralytics .pt files (weights/best.pt)")
    parser.add_argument("--data", default="data/shapes.yaml")
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--images", type=int, default=50, help="val images for the detect.py comparison")
    parser.add_argument("--repo-python", default=str(REPO / ".venv" / "bin" / "python"))
    parser.add_argument("--out", default="runs/equality")
    parser.add_argument("--ours-raw", nargs=3, metavar=("WEIGHTS", "INPUTS", "OUT"), help=argparse.SUPPRESS)
    return parser.parse_args()


def compare_raw(weights, work, imgsz, py, row):
    """Raw outputs into row: the same random batch through both, fp32, eval mode, not fused. Returns whether the
    checkpoint is a YOLO26 one (end-to-end, one-to-one head)."""
    import torch
    from ultralytics import YOLO
    from ultralytics.utils.ops import xywh2xyxy

    x = torch.rand(2, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    torch.save(x, work / "inputs.pt")
    theirs_model = YOLO(weights).model.float().eval()
    end2end = getattr(theirs_model.model[-1], "one2one_cv2", None) is not None  # YOLO26
    theirs_model.end2end = end2end  # its one-to-one head's final detections, as ours gives them
    with torch.no_grad():
        decoded, raw = theirs_model(x)  # eval: (decoded, {"boxes", "scores"} before decoding)
    branches = [raw["one2many"], raw["one2one"]] if end2end else [raw]
    theirs_raw = torch.cat([torch.cat((b["boxes"], b["scores"]), 1) for b in branches], 1)
    if not end2end:  # per anchor, xywh -> xyxy; YOLO26's detections are already x1 y1 x2 y2 score class
        decoded = decoded.transpose(1, 2)
        decoded = torch.cat((xywh2xyxy(decoded[..., :4]), decoded[..., 4:]), 2)
    run([py, __file__, "--ours-raw", weights, work / "inputs.pt", work / "ours_raw.pt"])
    ours = torch.load(work / "ours_raw.pt", weights_only=True)
    row["raw_shape"] = list(theirs_raw.shape)
    for layout in ("channels_last", "contiguous"):
        out_ours = ours[f"decoded_{layout}"]
        row[f"raw_max_diff_{layout}"] = float((ours[f"raw_{layout}"] - theirs_raw).abs().max())
        row[f"decoded_max_diff_boxes_px_{layout}"] = float((out_ours[..., :4] - decoded[..., :4]).abs().max())
        row[f"decoded_max_diff_scores_{layout}"] = float((out_ours[..., 4:] - decoded[..., 4:]).abs().max())
        if end2end:  # ranked detections: near-equal scores may swap rows, so the scores by rank, and the rows
            # that hold the same box and class at the same rank
            row[f"detections_max_diff_scores_by_rank_{layout}"] = float((out_ours - decoded)[..., 4].abs().max())
            same = ((out_ours - decoded)[..., :4].abs().amax(-1) < 1e-2) & (out_ours[..., 5] == decoded[..., 5])
            row[f"detections_same_rows_{layout}"] = f"{int(same.sum())}/{same.numel()}"
    return end2end


def match_detections(val_images, ours_det, results):
    """Our detect.py boxes (COCO json) matched one to one with Ultralytics' results per image (IoU > 0.99, same
    class): the detect_* entries of the row."""
    import torch

    n_ours = n_theirs = matched = 0
    worst = 0.0
    for path, result in zip(val_images, results):
        mine = [d for d in ours_det if Path(str(d.get("file_name", d["image_id"]))).stem == path.stem]
        a = torch.tensor(
            [[*d["bbox"][:2], d["bbox"][0] + d["bbox"][2], d["bbox"][1] + d["bbox"][3]] for d in mine]
        ).reshape(-1, 4)
        ca = torch.tensor([d["category_id"] for d in mine]).reshape(-1)
        b, cb = result.boxes.xyxy.float(), result.boxes.cls.long()
        n_ours, n_theirs = n_ours + len(a), n_theirs + len(b)
        if len(a) and len(b):
            iou = box_iou(a, b) * (ca[:, None] == cb[None])
            best, index = iou.max(1)
            ok = best > 0.99
            matched += int(ok.sum())
            if ok.any():
                worst = max(worst, float((a[ok] - b[index[ok]]).abs().max()))
    return dict(
        detect_images=len(val_images),
        detect_boxes_ours=n_ours,
        detect_boxes_theirs=n_theirs,
        detect_matched=matched,
        detect_max_diff_px=worst,
    )


def compare_detect(weights, work, val_images, args, nms, row):
    """detect.py against predict() into row: square letterbox on both sides (rect=False), same thresholds."""
    from ultralytics import YOLO

    listing = work / "images.txt"
    listing.write_text("".join(f"{p}\n" for p in val_images))
    run(
        [args.repo_python, "detect.py", "--weights", weights, "--source", listing, "--imgsz", args.imgsz]
        + ["--conf", "0.25", "--iou", "0.7", "--device", "cpu", "--save-json", "--out", work / "detect"]
    )
    ours_det = json.loads((work / "detect" / "predictions.json").read_text())
    results = YOLO(weights).predict(
        [str(p) for p in val_images],
        imgsz=args.imgsz,
        conf=0.25,
        iou=0.7,
        rect=False,
        device="cpu",
        verbose=False,
        nms=nms,
    )
    row.update(match_detections(val_images, ours_det, results))


def compare_val(weights, work, data_yaml, args, nms, row):
    """val.py against the validator into row, both through pycocotools (and the validator's own metric)."""
    from ultralytics import YOLO

    py = args.repo_python
    run(
        [py, "val.py", "--weights", weights, "--data", args.data, "--imgsz", args.imgsz, "--device", "cpu"]
        + ["--out", work / "val"]
    )
    metrics = json.loads((work / "val" / "metrics.json").read_text())
    row["val_ours_map"], row["val_ours_map50"] = metrics["mAP50-95"], metrics["mAP50"]
    validator = YOLO(weights).val(
        data=str(data_yaml),
        imgsz=args.imgsz,
        batch=32,
        conf=0.001,
        iou=0.7,
        nms=nms,
        save_json=True,
        plots=False,
        device="cpu",
        project=str(work),
        name="peer_val",
        exist_ok=True,
        verbose=False,
    )
    row["val_theirs_own_metric"] = round(float(validator.box.map), 5)
    detections = work / "peer_val" / "predictions.json"
    scored = run(
        [py, "bench/score_detections.py", "--data", args.data, "--detections", detections, "--category-offset", "1"]
    )
    found = re.search(r"mAP50-95 ([\d.]+) mAP50 ([\d.]+)", scored)
    row["val_theirs_map"], row["val_theirs_map50"] = float(found[1]), float(found[2])
    row["val_diff"] = round(row["val_ours_map"] - row["val_theirs_map"], 5)


def main():
    args = parse_args()
    if args.ours_raw:
        return ours_raw(*args.ours_raw)

    os.environ.setdefault("YOLO_OFFLINE", "1")
    sys.path.insert(0, str(REPO / "bench"))
    from peer import use_peer_config

    use_peer_config()  # before ultralytics is imported: it reads YOLO_CONFIG_DIR then
    import torch
    from ultralytics_shapes import write_dataset_yaml  # first: its import sets YOLO_AUTOINSTALL=0 for ultralytics

    torch.set_num_threads(2)
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_yaml, *_ = write_dataset_yaml(REPO / args.data, out, 0, 0)
    val_images = sorted((out / "dataset" / "images" / "val").iterdir())[: args.images]
    report = {}
    for weights in args.weights:
        weights = str(Path(weights).resolve())
        tag = Path(weights).parent.parent.parent.name or Path(weights).stem
        work = out / tag
        work.mkdir(exist_ok=True)
        row = report[tag] = {"weights": weights}
        end2end = compare_raw(weights, work, args.imgsz, args.repo_python, row)
        nms = False if end2end else None  # YOLO26: its NMS-free head (Ultralytics' default is the other one + NMS)
        compare_detect(weights, work, val_images, args, nms, row)
        compare_val(weights, work, data_yaml, args, nms, row)
        print(json.dumps({tag: row}, indent=1))

    (out / "equality.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {out / 'equality.json'}")


if __name__ == "__main__":
    main()
