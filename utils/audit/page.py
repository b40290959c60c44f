"""What a person reads of the label audit: issues.csv (every issue, most likely first) and index.html (one row per
issue: a crop of the image with the label's box and the model's, the kind, the score and the suggested fix). The page
uses nothing from the network: its crops are files beside it, its style is inline."""

import csv
import html
from collections import defaultdict
from pathlib import Path

import cv2

from utils.audit.folds import relative_link

COLUMNS = ("image", "kind", "class", "x1", "y1", "x2", "y2", "score", "suggested_class", "sx1", "sy1", "sx2", "sy2")
LABEL_COLOUR, MODEL_COLOUR = (40, 40, 230), (40, 200, 40)  # BGR: the label red, the model's box green


def suggestion_of(issue, names):
    """(suggested class name, suggested box or None) of an issue: what a reviewer would change it to."""
    if issue["kind"] == "wrong_class":
        return names[issue["suggestion"]], None
    if issue["kind"] in ("missing", "badly_placed"):
        return names[issue["cls"]], issue["suggestion"]
    return "", None  # spurious, duplicate: delete the box


def write_issues_csv(issues, names, path):
    """issues.csv: image, kind, class, the box in pixels, score, the suggested class and box (empty: delete it)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for issue in issues:
            cls, box = suggestion_of(issue, names)
            suggested = [f"{v:.1f}" for v in box] if box else [""] * 4
            box_written = [f"{v:.1f}" for v in issue["box"]]
            writer.writerow([issue["image"], issue["kind"], names[issue["cls"]], *box_written, f"{issue['score']:.4f}",
                             cls, *suggested])  # fmt: skip


def read_issues_csv(path):
    """The rows of issues.csv as dicts, boxes as float lists (None where empty)."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            box = [float(row[k]) for k in ("x1", "y1", "x2", "y2")]
            suggested = [float(row[k]) for k in ("sx1", "sy1", "sx2", "sy2")] if row["sx1"] else None
            rows.append({**row, "box": box, "suggested_box": suggested, "score": float(row["score"])})
    return rows


def crop(image, boxes, size=192):
    """The part of the image around these boxes (half their size again on each side), scaled to `size` px high."""
    h, w = image.shape[:2]
    x1 = min(b[0] for b in boxes)
    y1 = min(b[1] for b in boxes)
    x2 = max(b[2] for b in boxes)
    y2 = max(b[3] for b in boxes)
    pad = max(x2 - x1, y2 - y1, 16) / 2
    left, top = int(max(x1 - pad, 0)), int(max(y1 - pad, 0))
    right, bottom = int(min(x2 + pad, w)), int(min(y2 + pad, h))
    part = image[top:bottom, left:right].copy()
    scale = size / max(part.shape[0], 1)
    part = cv2.resize(part, (max(int(part.shape[1] * scale), 1), size))
    return part, (left, top, scale)


def draw(part, box, offset, colour):
    left, top, scale = offset
    corners = [int((v - o) * scale) for v, o in zip(box, (left, top, left, top))]
    cv2.rectangle(part, tuple(corners[:2]), tuple(corners[2:]), colour, 2)


def write_crops(issues, folder):
    """One JPEG per issue in folder/ (the label red, the model's box green); the file of each, in issue order."""
    folder.mkdir(parents=True, exist_ok=True)
    by_image = defaultdict(list)
    for n, issue in enumerate(issues):
        by_image[issue["image"]].append(n)
    files = [None] * len(issues)
    for image_path, numbers in by_image.items():
        image = cv2.imread(image_path)  # an image that stopped being readable since it was verified: no crop
        for n in numbers if image is not None else ():
            issue = issues[n]
            model_box = issue["suggestion"] if isinstance(issue["suggestion"], list) else None
            part, offset = crop(image, [issue["box"]] + ([model_box] if model_box else []))
            if issue["kind"] != "missing":
                draw(part, issue["box"], offset, LABEL_COLOUR)
            if model_box:
                draw(part, model_box, offset, MODEL_COLOUR)
            files[n] = folder / f"{n:05d}.jpg"
            cv2.imwrite(str(files[n]), part)
    return files


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Label audit</title>
<style>body{{font-family:sans-serif;margin:1em}} table{{border-collapse:collapse}} td,th{{border-bottom:1px solid #ccc;
padding:4px 8px;text-align:left;vertical-align:middle}} .label{{color:#e62828}} .model{{color:#28a828}}</style></head>
<body><h1>Label audit: {count} issues, most likely first</h1>
<p>Red: the box as labelled. Green: the model's box. Score: 0 to 1, how likely the label is wrong in this way.
{note}</p>
<table><thead><tr><th>#</th><th>crop</th><th>kind</th><th>label</th><th>suggested</th><th>score</th><th>image</th></tr>
</thead><tbody>
{rows}
</tbody></table>
<script>/* for a check in a headless browser: how many crops loaded */
window.addEventListener("load", function () {{
  var shown = 0;
  for (var image of document.images) {{ if (image.complete && image.naturalWidth > 0) shown++; }}
  document.body.setAttribute("data-crops-shown", shown);
}});</script></body></html>
"""
ROW = (
    '<tr class="issue"><td>{n}</td><td>{crop}</td><td>{kind}</td><td class="label">{label}</td>'
    '<td class="model">{suggested}</td><td>{score:.3f}</td><td><a href="{link}">{name}</a><br>{box}</td></tr>'
)


def write_page(issues, names, out, note=""):
    """out/index.html and its crops in out/crops/; one row per issue, in the order given."""
    out = Path(out)
    files = write_crops(issues, out / "crops")
    rows = []
    for n, (issue, file) in enumerate(zip(issues, files), 1):
        cls, box = suggestion_of(issue, names)
        shown = f'<img src="{relative_link(file, out)}" alt="crop {n}">' if file else "(image unreadable)"
        suggested = {"spurious": "delete the box", "duplicate": "delete this copy"}.get(issue["kind"], cls)
        if box:
            suggested += " at " + ", ".join(f"{v:.0f}" for v in box)
        label = "no box" if issue["kind"] == "missing" else names[issue["cls"]]
        rows.append(ROW.format(
            n=n, crop=shown, kind=issue["kind"].replace("_", " "), label=html.escape(label),
            suggested=html.escape(suggested), score=issue["score"],
            link=html.escape(relative_link(issue["image"], out)), name=html.escape(Path(issue["image"]).name),
            box=", ".join(f"{v:.0f}" for v in issue["box"]),
        ))  # fmt: skip
    (out / "index.html").write_text(PAGE.format(count=len(issues), note=html.escape(note), rows="\n".join(rows)))
