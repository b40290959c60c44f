"""Where a YOLO26 checkpoint's NMS-free answer loses to its own one-to-many head with NMS (val.py --nms): the same
weights scored six ways by pycocotools on a dataset's val split, as val.py scores them.

    python bench/nms_free_gap.py --weights runs/rd26/ours-26n-d32/320px/e40/s0/train/weights/best.pt \
        --data runs/rd26/data/voc.yaml --imgsz 320

- one-to-one: the model as it answers (its top 300 (anchor, class) scores, no NMS);
- one-to-one + NMS: the same per-anchor outputs with NMS at IoU 0.7: what duplicates of one object cost;
- one-to-one scores, one-to-many boxes: each anchor's one-to-one score with the box its one-to-many head gives:
  what the one-to-one box branch costs;
- one-to-many + NMS: val.py --nms;
- one-to-one, local maxima only: its answer from the anchors whose class logit is the largest of their 3x3
  neighbourhood (CenterNet's peak filter, a max-pool in the graph): what neighbours' duplicates cost;
- one-to-one boxes, both heads' scores: each anchor's one-to-one box scored by the geometric mean of the two heads'
  scores (the one-to-many head ranks crowded objects better; the one-to-one head still suppresses duplicates).

Then how each answer ranks (score_profile): the objects it finds, how many of them score 0.5 or more, and its
duplicates and other false positives. Last, where the one-to-one answer's duplicates come from: its detections above
score 0.2, best first, each matched to the labelled object of its class it overlaps most (IoU 0.5 or more); the first
of an object is its detection, a later one a duplicate, counted by the pyramid level (stride) of both. On BCCD, 26n's
red cells had their duplicates on the other level; with each object on one level (the "-level" variants), on the same
level: a neighbouring anchor.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from models.weights import load_weights  # noqa: E402
from utils.data.dataset_yaml import load_dataset_yaml  # noqa: E402
from utils.data.labels import load_verified  # noqa: E402
from utils.data.loader import ValDataset, make_loader  # noqa: E402
from utils.evaluate import evaluate  # noqa: E402
from utils.inference import from_pytorch  # noqa: E402

WAYS = {  # name: (output of the per-anchor one-to-one and one-to-many decodings, whether it is final: no NMS)
    "one-to-one": (lambda head, o2o, o2m, peak: head.top_detections(o2o), True),
    "one-to-one + NMS": (lambda head, o2o, o2m, peak: o2o, False),
    "one-to-one scores, one-to-many boxes": (
        lambda head, o2o, o2m, peak: head.top_detections(torch.cat((o2m[..., :4], o2o[..., 4:]), 2)),
        True,
    ),
    "one-to-many + NMS": (lambda head, o2o, o2m, peak: o2m, False),
    "one-to-one, local maxima only": (lambda head, o2o, o2m, peak: head.top_detections(o2o * peak), True),
    "one-to-one boxes, both heads' scores": (
        lambda head, o2o, o2m, peak: head.top_detections(
            torch.cat((o2o[..., :4], (o2o[..., 4:] * o2m[..., 4:]).sqrt()), 2)
        ),
        True,
    ),
}


def scored(network, way, loader, names, device, coco_json):
    """evaluate()'s result for the network answering `way`."""
    head = network.head
    combine, final = WAYS[way]

    @torch.no_grad()
    def run(x):
        head.return_maps = True
        try:
            _, maps = network(x.to(device).float())
        finally:
            head.return_maps = False
        o2o = maps["one2one"]
        return combine(head, head.decode(o2o), head.decode(maps["one2many"]), local_maxima(o2o, head.nc))

    model = {**from_pytorch(network, device), "run": run, "end2end": final}
    return evaluate(model, loader, names, device, coco_json)


def local_maxima(maps, nc):
    """(batch, anchors, 4 + nc) 1 where an anchor's class logit is the largest of its 3x3 neighbourhood on its level
    (CenterNet's peak filter), else 0; boxes always 1: a mask for the decoded maps."""
    peaks = [m[:, -nc:] == F.max_pool2d(m[:, -nc:], 3, 1, 1) for m in maps]
    peaks = torch.cat([p.flatten(2) for p in peaks], 2).transpose(1, 2)
    return torch.cat((peaks.new_ones(*peaks.shape[:2], 4), peaks), 2).float()


def xyxy(coco_boxes):
    """COCO's [x, y, w, h] boxes -> an (n, 4) tensor of x1 y1 x2 y2."""
    return torchvision.ops.box_convert(torch.tensor(coco_boxes, dtype=torch.float64).view(-1, 4), "xywh", "xyxy")


def score_profile(result, iou=0.5):
    """How an answer ranks, all classes together: (objects found, found with a score of 0.5 or more, duplicates and
    other false positives scoring 0.05 or more). Each image's detections of a class, best first, are matched to the
    unmatched labelled object of that class they overlap most (IoU `iou` or more); a detection that overlaps only
    objects already matched is a duplicate."""
    objects, answers = {}, {}
    for a in result["ground_truth"]["annotations"]:
        objects.setdefault((a["image_id"], a["category_id"]), []).append(a["bbox"])
    for d in result["detections"]:
        answers.setdefault((d["image_id"], d["category_id"]), []).append((d["score"], d["bbox"]))
    found = confident = duplicates = others = 0
    for key, detections in answers.items():
        boxes = xyxy(objects.get(key, []))
        matched = torch.zeros(len(boxes), dtype=torch.bool)
        for score, box in sorted(detections, key=lambda d: -d[0]):
            overlaps = torchvision.ops.box_iou(xyxy([box]), boxes)[0]
            free = torch.where(matched, -1.0, overlaps)
            if len(boxes) and free.max() >= iou:
                matched[free.argmax()] = True
                found, confident = found + 1, confident + (score >= 0.5)
            elif len(boxes) and overlaps.max() >= iou:
                duplicates += score >= 0.05
            else:
                others += score >= 0.05
    return found, confident, duplicates, others


@torch.no_grad()
def duplicates_by_level(network, loader, device, threshold=0.2):
    """{(stride of an object's first detection, stride of a later one): count} and {stride: first detections}."""
    head, duplicates, firsts = network.head, {}, {}
    head.return_maps = True
    try:
        for images, targets, _ in loader:
            maps = network(images.to(device).float().div_(255))[1]["one2one"]  # as evaluate() feeds it
            strides = head.split(maps)[1].squeeze(-1)  # each anchor's
            decoded = head.decode(maps)
            anchor, score, cls = head.top_pairs(decoded[..., 4:])
            boxes = decoded[..., :4].gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))
            for i in range(len(images)):
                gt = targets[targets[:, 0] == i].to(device)
                keep = score[i] > threshold  # best first already
                for c in cls[i][keep].unique():
                    mine, objects = keep & (cls[i] == c), gt[gt[:, 1] == c, 2:]
                    if not len(objects):
                        continue
                    iou = torchvision.ops.box_iou(boxes[i][mine], objects)
                    levels = strides[anchor[i][mine]].int().tolist()
                    owner = {}
                    for row, level in zip(iou, levels):
                        best = int(row.argmax())
                        if row[best] < 0.5:
                            continue
                        if best in owner:
                            duplicates[owner[best], level] = duplicates.get((owner[best], level), 0) + 1
                        else:
                            owner[best], firsts[level] = level, firsts.get(level, 0) + 1
    finally:
        head.return_maps = False
    return duplicates, firsts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="a YOLO26 .pt (one with a one-to-one head)")
    parser.add_argument("--data", required=True, help="the dataset yaml whose val split is scored")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=32)  # val.py's: the same rectangular batches
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    network = load_weights(args.weights, device).model.eval()
    if not getattr(network.head, "one_to_one", False):
        sys.exit(f"error: {args.weights} has no one-to-one head (a YOLO26 checkpoint has one)")
    data = load_dataset_yaml(args.data)
    records = load_verified(data["val"], data["nc"], "val")
    dataset = ValDataset(records, args.imgsz, args.batch, stride=max(network.head.strides), shape=None)
    loader = make_loader(dataset, batch_size=args.batch, workers=2)
    names = data["names"]
    print(f"{args.weights}: {len(records)} val images at {args.imgsz} px; pycocotools mAP50-95 (mAP50)")
    print("| answer | all | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    profiles = {}
    for way in WAYS:
        result = scored(network, way, loader, names, device, data["coco_jsons"]["val"])
        m = result["metrics"]
        cells = [f"{m['mAP50-95']:.3f} ({m['mAP50']:.3f})"]
        cells += [f"{c['mAP50-95']:.3f} ({c['mAP50']:.3f})" for c in result["per_class"]]
        print(f"| {way} | " + " | ".join(cells) + " |", flush=True)
        profiles[way] = score_profile(result)
    print(
        f"\nhow each answer ranks: all {m['instances']} objects, IoU 0.5, each image's detections of a class best first"
    )
    print("| answer | objects found | found, score >= 0.5 | duplicates >= 0.05 | other false positives >= 0.05 |")
    print("|---|---|---|---|---|")
    for way, counts in profiles.items():
        print(f"| {way} | " + " | ".join(str(int(c)) for c in counts) + " |")
    duplicates, firsts = duplicates_by_level(network, loader, device)
    strides = network.head.strides
    print("\none-to-one detections above score 0.2: objects' first detections (duplicates) by stride")
    print("| stride | first detections | " + " | ".join(f"duplicates at stride {s}" for s in strides) + " |")
    print("|---" * (len(strides) + 2) + "|")
    for stride in strides:
        counts = [str(duplicates.get((stride, other), 0)) for other in strides]
        print(f"| {stride} | {firsts.get(stride, 0)} | " + " | ".join(counts) + " |")


if __name__ == "__main__":
    main()
