"""Known label errors, injected with a fixed seed into a copy of a real set in its own format, for bench/audit_bench.py.

    python bench/audit_inject.py --voc ../datasets/BCCD --out runs/audit_bench/bccd --seed 0

Of the N boxes (VOC `difficult` ones left alone): 10% removed, 5% given another class, 5% shifted to an IoU of 0.4-0.6
with their original, and 3% of N spurious boxes added (a size drawn from the set's boxes of a class drawn by
frequency, placed where it overlaps no real box by more than IoU 0.1). Each box takes at most one error. The copy:
OUT/noisy (VOC: JPEGImages linking to the originals, rewritten Annotations, the ImageSets), OUT/noisy.yaml, and
OUT/truth.json (every injected error with its original, boxes as x1 y1 x2 y2 in 0-based pixels).
"""

import argparse
import json
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.audit.score import box_iou  # noqa: E402

FRACTIONS = {"missing": 0.10, "wrong_class": 0.05, "badly_placed": 0.05, "spurious": 0.03}


def read_voc(root):
    """[(stem, tree, width, height, [(object element, name, [xmin, ymin, xmax, ymax])])] of every annotation."""
    found = []
    for xml in sorted((root / "Annotations").glob("*.xml")):
        tree = ET.parse(xml)
        size = tree.getroot().find("size")
        w, h = int(float(size.findtext("width"))), int(float(size.findtext("height")))
        objects = []
        for obj in tree.getroot().findall("object"):
            if (obj.findtext("difficult") or "0").strip() == "1":
                continue
            box = [float(obj.find("bndbox").findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax")]
            objects.append((obj, obj.findtext("name").strip(), box))
        found.append((xml.stem, tree, w, h, objects))
    return found


def shifted(box, w, h, rng):
    """A box of IoU 0.4-0.6 with `box` (moved and resized at random), inside the image; None after 1000 tries."""
    x1, y1, x2, y2 = box
    bw, bh = x2 - x1, y2 - y1
    for _ in range(1000):
        sx, sy = rng.uniform(0.75, 1.33, 2)
        dx, dy = rng.uniform(-0.5, 0.5, 2) * (bw, bh)
        cx, cy = (x1 + x2) / 2 + dx, (y1 + y2) / 2 + dy
        new = np.round([cx - bw * sx / 2, cy - bh * sy / 2, cx + bw * sx / 2, cy + bh * sy / 2])
        new = np.clip(new, [1, 1, 1, 1], [w, h, w, h])
        if new[2] - new[0] >= 2 and new[3] - new[1] >= 2:
            iou = box_iou(np.array([[x1 - 1, y1 - 1, x2, y2]]), np.array([[new[0] - 1, new[1] - 1, new[2], new[3]]]))
            if 0.4 <= iou[0, 0] <= 0.6:
                return new.tolist()
    return None


def spurious_box(size, boxes, w, h, rng):
    """A box of this (width, height) where it overlaps no real box by IoU 0.1 or more; None after 1000 tries."""
    bw, bh = min(size[0], w - 2), min(size[1], h - 2)
    for _ in range(1000):
        x1, y1 = rng.uniform(1, w - bw), rng.uniform(1, h - bh)
        new = np.round([x1, y1, x1 + bw, y1 + bh])
        if not len(boxes) or box_iou(new[None] - [1, 1, 0, 0], np.array(boxes) - [1, 1, 0, 0]).max() < 0.1:
            return new.tolist()
    return None


def inject(annotations, names, seed):
    """{stem: [(name, box)]} after the errors, and the list of errors (boxes in the file's 1-based numbers)."""
    rng = np.random.default_rng(seed)
    boxes = [(a, k) for a, (_, _, _, _, objects) in enumerate(annotations) for k in range(len(objects))]
    n = len(boxes)
    order = rng.permutation(n)
    counts = {kind: round(f * n) for kind, f in FRACTIONS.items() if kind != "spurious"}
    chosen, start = {}, 0
    for kind, count in counts.items():
        for i in order[start : start + count]:
            chosen[boxes[i]] = kind
        start += count
    new, errors = {}, []
    for a, (stem, _, w, h, objects) in enumerate(annotations):
        kept = []
        for k, (_, name, box) in enumerate(objects):
            kind = chosen.get((a, k))
            error = dict(image=stem, kind=kind, original_class=name, original_box=box)
            if kind == "missing":
                errors.append(error)
                continue
            if kind == "wrong_class":
                name_new = str(rng.choice([x for x in names if x != name]))
                errors.append({**error, "class": name_new, "box": box})
                kept.append((name_new, box))
            elif kind == "badly_placed" and (moved := shifted(box, w, h, rng)) is not None:
                errors.append({**error, "class": name, "box": moved})
                kept.append((name, moved))
            else:
                kept.append((name, box))
        new[stem] = kept
    classes = [name for _, _, _, _, objects in annotations for _, name, _ in objects]
    sizes = {c: [(b[2] - b[0], b[3] - b[1]) for _, _, _, _, o in annotations for _, x, b in o if x == c] for c in names}
    for _ in range(round(FRACTIONS["spurious"] * n)):
        a = int(rng.integers(len(annotations)))
        stem, _, w, h, objects = annotations[a]
        name = str(classes[rng.integers(len(classes))])
        box = spurious_box(sizes[name][rng.integers(len(sizes[name]))], [b for _, _, b in objects], w, h, rng)
        if box is not None:
            errors.append(dict(image=stem, kind="spurious", original_class=None, original_box=None, **{"class": name},
                               box=box))  # fmt: skip
            new[stem].append((name, box))
    return new, errors


def write_voc(root, out, annotations, new):
    """The noisy VOC copy: the images linked, each XML with its objects replaced (difficult ones kept)."""
    for sub in ("Annotations", "JPEGImages"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    shutil.copytree(root / "ImageSets", out / "ImageSets", dirs_exist_ok=True)
    for image in (root / "JPEGImages").iterdir():
        link = out / "JPEGImages" / image.name
        if not link.exists():
            os.symlink(image.resolve(), link)
    for stem, tree, _, _, objects in annotations:
        top = tree.getroot()
        for obj, _, _ in objects:
            top.remove(obj)
        for name, box in new[stem]:
            obj = ET.SubElement(top, "object")
            ET.SubElement(obj, "name").text = name
            ET.SubElement(obj, "difficult").text = "0"
            bndbox = ET.SubElement(obj, "bndbox")
            for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), box):
                ET.SubElement(bndbox, tag).text = str(int(round(v)))
        tree.write(out / "Annotations" / f"{stem}.xml")


def zero_based(box):
    """VOC's 1-based xmin/ymin as the 0-based pixels the repo reads (utils/data/voc.py)."""
    return None if box is None else [box[0] - 1, box[1] - 1, box[2], box[3]]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voc", required=True, help="a VOC folder (Annotations, JPEGImages, ImageSets)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root, out = Path(args.voc).resolve(), Path(args.out).resolve()
    annotations = read_voc(root)
    names = sorted({name for *_, objects in annotations for _, name, _ in objects})
    new, errors = inject(annotations, names, args.seed)
    write_voc(root, out / "noisy", annotations, new)
    (out / "noisy.yaml").write_text(f"voc: {out / 'noisy'}\nnames: {json.dumps(names)}\n")
    (out / "clean.yaml").write_text(f"voc: {root}\nnames: {json.dumps(names)}\n")
    for e in errors:
        e["box"], e["original_box"] = zero_based(e.get("box")), zero_based(e["original_box"])
        e["image"] = str(out / "noisy" / "JPEGImages" / f"{e['image']}.jpg")
    (out / "truth.json").write_text(json.dumps({"names": names, "errors": errors}, indent=1))
    counts = {kind: sum(e["kind"] == kind for e in errors) for kind in FRACTIONS}
    print(f"{sum(len(o) for *_, o in annotations)} boxes; injected {counts} into {out / 'noisy'}")


if __name__ == "__main__":
    main()
