"""Known label errors, injected with a fixed seed into a copy of a real set in its own format, for bench/audit_bench.py.

    python bench/audit_inject.py --voc ../datasets/BCCD --out runs/audit_bench/bccd --seed 0
    python bench/audit_inject.py --voc ../datasets/Tensorflow-Object-Detection-API-Train-Model/images \\
        --splits "train: [train, test]" "val: 0.2" --out runs/audit_bench/microcontrollers      # XML beside photos
    python bench/audit_inject.py --coco ../datasets/ChessPiecesv23 --splits "train: train/_annotations.coco.json" \\
        "val: valid/_annotations.coco.json" --out runs/audit_bench/chess                        # COCO json

Of the N boxes (VOC `difficult` and COCO `iscrowd` ones left alone): 10% removed, 5% given another class, 5% shifted
to an IoU of 0.4-0.6 with their original, and 3% of N spurious boxes added (a size drawn from the set's boxes of a
class drawn by frequency, placed where it overlaps no real box by more than IoU 0.1). Each box takes at most one
error. The copy, OUT/noisy, keeps the set's own layout: its image folders as links to the originals, every
annotation file rewritten (VOC: Annotations/ and ImageSets/, or each XML beside its photo; COCO: each json where it
was). Beside it OUT/noisy.yaml (the splits: a VOC folder's own ImageSets, else --splits), OUT/clean.yaml (the same
on the original) and OUT/truth.json (every injected error with its original, boxes as x1 y1 x2 y2 in 0-based pixels).
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
IMAGES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")  # a tuple: the same lookup order every run


def voc_pairs(root):
    """[(xml, image)] of a VOC folder (Annotations/ and JPEGImages/) or of a folder with each photo's XML beside it."""
    if (root / "Annotations").is_dir():
        images = {p.stem: p for p in (root / "JPEGImages").iterdir() if p.suffix.lower() in IMAGES}
        xmls = sorted((root / "Annotations").glob("*.xml"))
        return [(xml, images.get(xml.stem, root / "JPEGImages" / f"{xml.stem}.jpg")) for xml in xmls]
    pairs = []
    for xml in sorted(root.rglob("*.xml")):
        image = next(
            (xml.with_suffix(s) for s in (*IMAGES, *map(str.upper, IMAGES)) if xml.with_suffix(s).exists()), None
        )
        if image is not None:  # an XML without its photo is not read by the repo either
            pairs.append((xml, image))
    return pairs


def read_voc(root):
    """[(image, (tree, xml), width, height, [(object element, name, [xmin, ymin, xmax, ymax])])] of every annotation,
    image and xml relative to root."""
    found = []
    for xml, image in voc_pairs(root):
        tree = ET.parse(xml)
        size = tree.getroot().find("size")
        w, h = int(float(size.findtext("width"))), int(float(size.findtext("height")))
        objects = []
        for obj in tree.getroot().findall("object"):
            if (obj.findtext("difficult") or "0").strip() == "1":
                continue
            box = [float(obj.find("bndbox").findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax")]
            objects.append((obj, obj.findtext("name").strip(), box))
        found.append((str(image.relative_to(root)), (tree, xml.relative_to(root)), w, h, objects))
    return found


def coco_image(root, json_path, file_name, by_name):
    """The image a json's file_name names: beside the json, else the one of that name under root (the repo's
    fallback for an `images:` folder elsewhere)."""
    direct = json_path.parent / file_name
    if direct.exists():
        return direct
    found = by_name.get(Path(file_name).name, [])
    if len(found) != 1:
        sys.exit(f"{json_path}: image {file_name!r} is {'not' if not found else 'more than once'} under {root}")
    return found[0]


def read_coco(root):
    """(annotations as read_voc's, with (json, image entry) in place of the tree, and boxes as x y x+w y+h; {json
    relative to root: its parsed content}) of every COCO json under root."""
    found, docs = [], {}
    by_name = {}
    for p in sorted(root.rglob("*")):
        if p.suffix.lower() in IMAGES:
            by_name.setdefault(p.name, []).append(p)
    for path in sorted(root.rglob("*.json")):
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and {"images", "annotations", "categories"} <= set(data)):
            continue
        rel = path.relative_to(root)
        docs[rel] = data
        names = {c["id"]: str(c["name"]) for c in data["categories"]}
        of_image = {}
        for a in data["annotations"]:
            of_image.setdefault(a["image_id"], []).append(a)
        for im in data["images"]:
            objects = [
                (a, names[a["category_id"]], [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                                              a["bbox"][1] + a["bbox"][3]])
                for a in of_image.get(im["id"], []) if not a.get("iscrowd")
            ]  # fmt: skip
            image = coco_image(root, path, im["file_name"], by_name)
            found.append((str(image.relative_to(root)), (rel, im), int(im["width"]), int(im["height"]), objects))
    return found, docs


def shifted(box, w, h, rng, base=1):
    """A box of IoU 0.4-0.6 with `box` (moved and resized at random), inside the image; None after 1000 tries.
    base: the file's first pixel (VOC counts from 1, COCO from 0)."""
    x1, y1, x2, y2 = box
    bw, bh = x2 - x1, y2 - y1
    for _ in range(1000):
        sx, sy = rng.uniform(0.75, 1.33, 2)
        dx, dy = rng.uniform(-0.5, 0.5, 2) * (bw, bh)
        cx, cy = (x1 + x2) / 2 + dx, (y1 + y2) / 2 + dy
        new = np.round([cx - bw * sx / 2, cy - bh * sy / 2, cx + bw * sx / 2, cy + bh * sy / 2])
        new = np.clip(new, [base, base, base, base], [w, h, w, h])
        if new[2] - new[0] >= 2 and new[3] - new[1] >= 2:
            b = base
            iou = box_iou(np.array([[x1 - b, y1 - b, x2, y2]]), np.array([[new[0] - b, new[1] - b, new[2], new[3]]]))
            if 0.4 <= iou[0, 0] <= 0.6:
                return new.tolist()
    return None


def spurious_box(size, boxes, w, h, rng, base=1):
    """A box of this (width, height) where it overlaps no real box by IoU 0.1 or more; None after 1000 tries."""
    bw, bh = min(size[0], w - 2), min(size[1], h - 2)
    shift = [base, base, 0, 0]
    for _ in range(1000):
        x1, y1 = rng.uniform(base, w - bw), rng.uniform(base, h - bh)
        new = np.round([x1, y1, x1 + bw, y1 + bh])
        if not len(boxes) or box_iou(new[None] - shift, np.array(boxes) - shift).max() < 0.1:
            return new.tolist()
    return None


def chosen_kinds(annotations, rng):
    """{(annotation index, object index): kind} of the boxes that lose or change, and the number of boxes."""
    boxes = [(a, k) for a, (_, _, _, _, objects) in enumerate(annotations) for k in range(len(objects))]
    n = len(boxes)
    order = rng.permutation(n)
    counts = {kind: round(f * n) for kind, f in FRACTIONS.items() if kind != "spurious"}
    chosen, start = {}, 0
    for kind, count in counts.items():
        for i in order[start : start + count]:
            chosen[boxes[i]] = kind
        start += count
    return chosen, n


def inject(annotations, names, seed, base=1):
    """{image: [(name, box)]} after the errors, and the list of errors (boxes in the file's numbers)."""
    rng = np.random.default_rng(seed)
    chosen, n = chosen_kinds(annotations, rng)
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
            elif kind == "badly_placed" and (moved := shifted(box, w, h, rng, base)) is not None:
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
        size = sizes[name][rng.integers(len(sizes[name]))]
        box = spurious_box(size, [b for _, _, b in objects], w, h, rng, base)
        if box is not None:
            errors.append(dict(image=stem, kind="spurious", original_class=None, original_box=None, **{"class": name},
                               box=box))  # fmt: skip
            new[stem].append((name, box))
    return new, errors


def link_images(root, out, annotations):
    """Every image of the folders the annotated images lie in, linked into the same place under out."""
    for folder in sorted({Path(image).parent for image, *_ in annotations}):
        (out / folder).mkdir(parents=True, exist_ok=True)
        for image in (root / folder).iterdir():
            link = out / folder / image.name
            if image.suffix.lower() in IMAGES and not link.exists():
                os.symlink(image.resolve(), link)


def write_voc(root, out, annotations, new):
    """The noisy VOC copy: the images linked, each XML with its objects replaced (difficult ones kept)."""
    link_images(root, out, annotations)
    if (root / "ImageSets").is_dir():
        shutil.copytree(root / "ImageSets", out / "ImageSets", dirs_exist_ok=True)
    for image, (tree, xml), _, _, objects in annotations:
        top = tree.getroot()
        for obj, _, _ in objects:
            top.remove(obj)
        for name, box in new[image]:
            obj = ET.SubElement(top, "object")
            ET.SubElement(obj, "name").text = name
            ET.SubElement(obj, "difficult").text = "0"
            bndbox = ET.SubElement(obj, "bndbox")
            for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), box):
                ET.SubElement(bndbox, tag).text = str(int(round(v)))
        (out / xml).parent.mkdir(parents=True, exist_ok=True)
        tree.write(out / xml)


def write_coco(root, out, annotations, new, docs):
    """The noisy COCO copy: the images linked, each json with its annotations replaced (crowd ones kept)."""
    link_images(root, out, annotations)
    ids = {}
    for rel, data in docs.items():
        data["annotations"] = [a for a in data["annotations"] if a.get("iscrowd")]
        ids[rel] = {str(c["name"]): c["id"] for c in data["categories"]}
    for image, (rel, im), _, _, _ in annotations:
        kept = docs[rel]["annotations"]
        for name, (x1, y1, x2, y2) in new[image]:
            bbox = [x1, y1, x2 - x1, y2 - y1]
            kept.append(dict(id=len(kept), image_id=im["id"], category_id=ids[rel][name], bbox=bbox,
                             area=bbox[2] * bbox[3], segmentation=[], iscrowd=0))  # fmt: skip
    for rel, data in docs.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(json.dumps(data))


def zero_based(box, base=1):
    """The file's box as the 0-based pixels the repo reads (VOC's xmin/ymin count from 1: utils/data/voc.py)."""
    return None if box is None else [box[0] - base, box[1] - base, box[2], box[3]]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--voc", help="a VOC folder (Annotations, JPEGImages, ImageSets) or photos with XML beside")
    source.add_argument("--coco", help="a folder of COCO jsons (every one under it), each with its images")
    parser.add_argument("--splits", nargs="*", default=[], help='dataset-yaml lines, e.g. "train: train" "val: 0.2"')
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = Path(args.voc or args.coco).resolve()
    if not args.splits and (args.coco or not (root / "ImageSets").is_dir()):
        parser.error(f"{root} has no ImageSets/: name its train and val with --splits (dataset-yaml lines)")
    return args, root, Path(args.out).resolve()


def main():
    args, root, out = parse_args()
    base = 1 if args.voc else 0
    annotations, docs = (read_voc(root), None) if args.voc else read_coco(root)
    names = sorted({name for *_, objects in annotations for _, name, _ in objects})
    new, errors = inject(annotations, names, args.seed, base)
    if args.voc:
        write_voc(root, out / "noisy", annotations, new)
    else:
        write_coco(root, out / "noisy", annotations, new, docs)
    splits = "".join(line + "\n" for line in args.splits)
    names_line = f"names: {json.dumps(names)}\n" if args.voc else ""  # COCO: the json's categories, as they are
    key = "voc" if args.voc else "path"
    (out / "noisy.yaml").write_text(f"{key}: {out / 'noisy'}\n{splits}{names_line}")
    (out / "clean.yaml").write_text(f"{key}: {root}\n{splits}{names_line}")
    for e in errors:
        e["box"], e["original_box"] = zero_based(e.get("box"), base), zero_based(e["original_box"], base)
        e["image"] = str(out / "noisy" / e["image"])
    (out / "truth.json").write_text(json.dumps({"names": names, "errors": errors}, indent=1))
    counts = {kind: sum(e["kind"] == kind for e in errors) for kind in FRACTIONS}
    print(f"{sum(len(o) for *_, o in annotations)} boxes; injected {counts} into {out / 'noisy'}")


if __name__ == "__main__":
    main()
