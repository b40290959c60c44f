"""Hostile and odd inputs, fuzzed with hypothesis (issue 40): images of every format, mode and orientation, with lying
suffixes, emptied, truncated or garbled, in a folder whose path has spaces and non-ASCII characters; dataset yamls with
wrong types, missing keys and a names list shorter than the classes used. Each bad input is excluded or refused with one
sentence naming its file (and line or key); no traceback; the user's files are never modified; verifying a file that
declares 900 megapixels stays far under 1 GB. `pytest tests/test_hostile.py -s` prints the cases and their outcomes.
"""

import hashlib
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from data_helpers import png_declaring
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from utils.data import labels as L
from utils.data.dataset_yaml import load_dataset_yaml
from utils.data.images import MAX_PIXELS, load_original, load_resized
from utils.general import DatasetError

REPO = Path(__file__).resolve().parents[1]
FOLDER = "dätä set ü"  # spaces and non-ASCII in every path the tests write

# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

PIL_FORMAT = {"png": "PNG", "jpg": "JPEG", "bmp": "BMP", "webp": "WEBP", "tiff": "TIFF"}
MODES = {  # what each format stores (PIL converts others on save, or refuses them)
    "png": ["L", "LA", "RGB", "RGBA", "P", "I;16"],
    "jpg": ["L", "RGB", "CMYK"],
    "bmp": ["L", "RGB", "RGBA", "P"],
    "webp": ["L", "LA", "RGB", "RGBA", "P"],
    "tiff": ["L", "LA", "RGB", "RGBA", "P", "CMYK", "I;16"],
}
SUFFIXES = [".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".PNG", ".JPG"]
CORRUPTIONS = ["none", "none", "zero bytes", "truncated", "random bytes"]  # "none" twice: most images are good

IMAGE = st.sampled_from(sorted(MODES)).flatmap(
    lambda fmt: st.fixed_dictionaries(
        {
            "format": st.just(fmt),
            "mode": st.sampled_from(MODES[fmt]),
            "w": st.integers(1, 64) | st.integers(10, 64),  # under 10 px is excluded: not too often
            "h": st.integers(1, 64) | st.integers(10, 64),
            "orientation": st.integers(1, 8) if fmt == "jpg" else st.just(1),  # EXIF, as phones write it
            "suffix": st.sampled_from([f".{fmt}", *SUFFIXES]),  # often one of another format: a lying suffix
            "corruption": st.sampled_from(CORRUPTIONS),
            "cut": st.floats(0.0, 0.999),  # where a truncated file ends (a fraction of it)
            "seed": st.integers(0, 2**16),
        }
    )
)


def image_bytes(case):
    """The file's bytes: random pixels in the case's format, mode and size, then its corruption."""
    rng = np.random.default_rng(case["seed"])
    mode, size = case["mode"], (case["w"], case["h"])
    if mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65536, (case["h"], case["w"]), dtype=np.uint16)).convert(mode)
    else:
        image = Image.frombytes(mode, size, rng.integers(0, 256, len(Image.new(mode, size).tobytes()), np.uint8))
    extra = {}
    if case["orientation"] != 1:
        exif = Image.Exif()
        exif[0x0112] = case["orientation"]
        extra["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, PIL_FORMAT[case["format"]], **extra)
    data = buffer.getvalue()
    if case["corruption"] == "zero bytes":
        return b""
    if case["corruption"] == "truncated":
        return data[: int(len(data) * case["cut"])]
    if case["corruption"] == "random bytes":
        return rng.integers(0, 256, len(data), np.uint8).tobytes()
    return data


def expected_shape(case):
    """(h, w) as training sees a good image: a JPEG's EXIF orientation 5-8 turns it by 90 degrees."""
    turned = case["format"] == "jpg" and case["orientation"] >= 5
    return (case["w"], case["h"]) if turned else (case["h"], case["w"])


def digests(folder):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def reason_kind(note):
    """A reason without its file-specific details, to count the outcomes by."""
    for kind in ("empty (0 bytes)", "truncated JPEG", "truncated PNG", "truncated", "cannot be decoded", "only"):
        if kind in note:
            return kind
    return note[:40]


def check_dataset(root, cases, outcomes):
    """Write the cases as images (one valid label row each), verify them and load every kept image as training does."""
    images = root / "images" / "train"
    images.mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    paths = {}
    for i, case in enumerate(cases):
        path = images / f"bild {i} é{case['suffix']}"
        path.write_bytes(image_bytes(case))
        Path(L.label_path(str(path))).write_text("0 0.5 0.5 0.5 0.5\n")
        paths[str(path)] = case
    before = digests(root)
    try:
        records = L.load_verified([images], nc=1, split_name="train", workers=1)
    except DatasetError as e:  # none usable: one sentence that says where the reasons are
        assert "none of the" in str(e) and "\n" not in str(e) and str(images) in str(e), e
        records = []
    after = digests(root)
    assert {p: after[p] for p in before} == before, "an image or a label was modified"
    try:  # from the cache, the same verdict: it once returned no image at all where none was usable
        assert len(L.load_verified([images], nc=1, split_name="train", workers=1)) == len(records) > 0
    except DatasetError as e:
        assert not records and "none of the" in str(e), e
    log_path = L.cache_locations([images], sorted(paths))[0][1]
    problems = {line.split("\t")[1]: line.split("\t")[2] for line in log_path.read_text().splitlines()}
    kept = {r["im"]: r for r in records}
    for path, case in paths.items():
        if path in kept:
            check_kept(kept[path], case)
            outcome = "kept"
        else:
            assert path in problems, f"{path} excluded without a reason in {log_path}"
            outcome = f"excluded: {reason_kind(problems[path])}"
            if case["corruption"] == "none":  # a good image is excluded only when it is too small
                assert min(case["w"], case["h"]) < 10, (case, problems[path])
        key = (case["corruption"], outcome)
        outcomes[key] = outcomes.get(key, 0) + 1
        suffix = case["suffix"].lower().replace("jpeg", "jpg").replace("tiff", "tif")
        for odd, present in (
            ("a lying suffix", suffix != f".{case['format']}".replace("tiff", "tif")),
            ("EXIF-rotated", case["orientation"] != 1),
            (f"mode {case['mode']}", True),
        ):
            outcomes[("odd", odd)] = outcomes.get(("odd", odd), 0) + present


def check_kept(record, case):
    """A kept image decodes (as the training and validation loaders read it) to HxWx3 uint8 of the verified size."""
    h, w = record["shape"]
    if case["corruption"] == "none":
        assert (h, w) == expected_shape(case), (case, record["shape"])
    assert min(h, w) >= 10
    for img in (load_original(record), load_original(record, reduce=2), load_resized(record, 32)[0]):
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3, (case, img.shape)
    assert load_original(record).shape[:2] == (h, w), case
    assert max(load_resized(record, 32)[0].shape[:2]) == 32


@pytest.mark.filterwarnings("ignore::UserWarning:PIL.TiffImagePlugin")  # pytest shows what images.py silences
def test_hostile_images_are_kept_and_decoded_or_excluded_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user cache ø"))
    outcomes, count = {}, [0]

    # derandomized: the same cases on every run (CI must be reproducible)
    @settings(max_examples=600, deadline=None, derandomize=True, database=None)
    @given(cases=st.lists(IMAGE, min_size=1, max_size=4))
    def fuzz(cases):
        count[0] += 1
        check_dataset(tmp_path / FOLDER / str(count[0]), cases, outcomes)

    fuzz()
    odd = {key[1]: outcomes.pop(key) for key in sorted(outcomes) if key[0] == "odd"}
    n = sum(outcomes.values())
    print(f"fuzzed images: {n} in {count[0]} datasets; among them {odd}; by (corruption, outcome):")
    for key in sorted(outcomes):
        print(f"  {key[0]:>12}  {key[1]}: {outcomes[key]}")
    kept = sum(v for (_, outcome), v in outcomes.items() if outcome == "kept")
    assert n >= 1200 and kept > 300 and n - kept > 300


# ---------------------------------------------------------------------------------------------
# Dataset yamls
# ---------------------------------------------------------------------------------------------

# Text that cannot name a folder outside the test's own: "/", "~" or ".." as a train path would verify every image
# of the machine (a CI worker grew to 20 GB on one), which tests nothing but the disk.
SAFE = st.characters(blacklist_characters="/\\~.:", blacklist_categories=("Cs",))


def text(max_size):
    return st.text(SAFE, max_size=max_size)


WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**20),
    st.floats(allow_nan=True),
    text(8),
    st.lists(st.one_of(st.integers(), text(4), st.none()), max_size=3),
    st.dictionaries(st.one_of(text(3), st.integers(-2, 4), st.floats()), text(3), max_size=3),
)
NAMES = st.one_of(
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4),  # shorter than the 3 classes used, or not
    st.integers(1, 4).map(lambda n: {i: f"c{i}" for i in range(n)}),
    st.integers(1, 4).map(lambda n: {str(i): f"c{i}" for i in range(n)}),
    WRONG,
)
KEYS = {  # each key: left out, a usable value, or a wrong one
    "path": st.one_of(st.just("."), st.just(f"../{FOLDER}"), st.just(f"{FOLDER}/nowhere"), WRONG),
    "train": st.one_of(st.just("images/train"), st.just(["images/train", "images/val"]), WRONG),
    "val": st.one_of(st.just("images/val"), st.just("train list.txt"), st.floats(0.01, 0.99), WRONG),  # or held out
    "test": st.one_of(st.just("images/test"), st.floats(0.01, 0.5), WRONG),
    "names": NAMES,
    "nc": st.one_of(st.integers(0, 5), WRONG),
    "defaults": st.one_of(st.just({"epochs": 3}), WRONG),
    "coco_json": st.one_of(st.just("nowhere.json"), WRONG),
    "voc": WRONG,
}
ANY_KEYS = st.fixed_dictionaries({}, optional=KEYS)
SPLITS_GOOD = st.fixed_dictionaries(  # usable splits; names and nc fuzzed
    {"train": st.sampled_from(["images/train", ["images/train", "images/val"]]), "val": KEYS["val"], "names": NAMES},
    optional={"nc": KEYS["nc"], "path": st.sampled_from([".", f"../{FOLDER}"])},
)
# weighted by hand: hypothesis draws the branches of a one_of about evenly, and a mapping is what is worth fuzzing
YAML_CFG = st.sampled_from([ANY_KEYS, SPLITS_GOOD, SPLITS_GOOD, WRONG]).flatmap(lambda strategy: strategy)


def make_dataset(root):
    """Two tiny images per split whose labels use classes 0, 1 and 2, and a .txt list of the val images."""
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(2):
            cv2_write(root / "images" / split / f"bild {i} ü.png")
            (root / "labels" / split / f"bild {i} ü.txt").write_text(f"{i} 0.5 0.5 0.2 0.2\n2 0.3 0.3 0.1 0.1\n")
    (root / "train list.txt").write_text("images/val/bild 0 ü.png\n")


def cv2_write(path):
    Image.fromarray(np.full((16, 20, 3), 90, np.uint8)).save(path)


def check_yaml(folder, cfg, outcomes):
    """load_dataset_yaml, then load_verified on what it read: either they work, or DatasetError names the yaml or the
    file; no other exception. The outcome is counted in `outcomes`."""
    path = folder / "dätä config.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    try:
        data = load_dataset_yaml(path)
    except DatasetError as e:
        message = str(e)
        assert "\n" not in message and str(path) in message, message
        message = re.sub(r" names .*, which does not exist", " names ..., which does not exist", message)
        message = re.sub(r"\d+", "N", re.sub(r",? got .*", "", message.replace(str(path), "<yaml>")))  # by kind
        outcome = "refused: " + message[:64]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return
    assert isinstance(data["names"], list) and all(isinstance(n, str) for n in data["names"]), data["names"]
    assert data["nc"] == len(data["names"]) > 0 and data["train"] and data["val"]
    try:
        records = L.load_verified(data["train"], data["nc"], "train", workers=1)
        outcome = f"loaded, {len(records)} of the train images kept"
    except DatasetError as e:
        message = str(e)
        assert "\n" not in message and FOLDER in message, message
        outcome = "loaded, no train image kept"
    outcomes[outcome] = outcomes.get(outcome, 0) + 1


def test_fuzzed_dataset_yamls_load_or_get_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user cache ø"))
    folder = tmp_path / FOLDER
    make_dataset(folder)
    outcomes = {}

    @settings(max_examples=500, deadline=None, derandomize=True, database=None)
    @given(cfg=YAML_CFG)
    @example(cfg={"path": f"../{FOLDER}", "train": "images/train", "val": "images/val", "names": ["a", "b"]})  # 3 used
    @example(cfg={"train": [1, 2], "val": "images/val", "names": ["a"]})
    @example(cfg={"train": "images/train", "val": "images/val", "names": 3})
    @example(cfg={"train": "images/train", "val": "images/val", "names": {"a": "x"}})
    @example(cfg={"train": "images/train", "val": "images/val", "nc": "3"})
    @example(cfg={"train": "images/train", "val": "images/val"})
    @example(cfg={"val": "images/val", "names": ["a"]})
    def fuzz(cfg):
        check_yaml(folder, cfg, outcomes)

    fuzz()
    print(f"fuzzed dataset yamls: {sum(outcomes.values())} cases, by outcome:")
    for key in sorted(outcomes):
        print(f"  {key}: {outcomes[key]}")
    assert sum(outcomes.values()) >= 500 and any(k.startswith("loaded") for k in outcomes)


def count_load_outcome(path, content, outcomes):
    """Write `content` to the dataset file `path` and count what loading it gives in `outcomes`: `loaded, N class`,
    else its refusal, which must be one line naming the file (counted by kind: the file and the details left out)."""
    path.write_bytes(content)
    try:
        outcome = f"loaded, {load_dataset_yaml(path)['nc']} class"
    except DatasetError as e:
        assert "\n" not in str(e) and str(path) in str(e), e
        outcome = re.sub(r" \(.*|, got .*", "", str(e).replace(str(path), "<file>"))
    outcomes[outcome] = outcomes.get(outcome, 0) + 1


def test_fuzzed_yaml_files_that_are_not_text_or_not_yaml_get_one_sentence(tmp_path):
    outcomes = {}

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(content=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
    @example(content=b"train: \xff\xfe images\nval: images\n")  # not UTF-8
    @example(content=b"[" * 5000 + b"]" * 5000)  # deeper than the parser's recursion
    @example(content=b"\xef\xbb\xbftrain: [1]\nval: x\n")  # a byte-order mark
    @example(content=b'!!python/object/apply:os.system ["echo"]')
    def fuzz(content):
        count_load_outcome(tmp_path / "dätä config.yaml", content, outcomes)

    fuzz()
    print(f"fuzzed yaml files: {sum(outcomes.values())} cases, by outcome: {outcomes}")
    assert sum(outcomes.values()) >= 200


OBJ_DATA_LINE = st.tuples(
    st.sampled_from(["train", "valid", "Validation", "test", "names", "classes", "train", "names", "", "# x"]),
    st.sampled_from([" = ", "=", " = ", " = ", ""]),  # mostly well-formed lines: deeper into the reader
    st.sampled_from(["list.txt", "data/list.txt", "obj.names", "data/obj.names", "", "a" * 300, "x\x00y", "..", "/"]),
).map("".join)


def test_fuzzed_obj_data_files_load_or_get_one_sentence(tmp_path):
    """Darknet / CVAT obj.data (utils/data/dataset_yaml.py): lines of keys, values and junk the reader meets, bytes."""
    (tmp_path / "obj.names").write_text("a\n")
    (tmp_path / "list.txt").write_text("")
    outcomes = {}

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(
        content=st.one_of(st.lists(OBJ_DATA_LINE, max_size=6).map("\n".join).map(str.encode), st.binary(max_size=64))
    )
    @example(content=b"train = data/list.txt\nvalid = data/list.txt\nnames = data/obj.names\n")  # CVAT's
    @example(content=b"train = list.txt\nvalid = list.txt\nnames = " + b"a" * 5000)  # too long to look up
    def fuzz(content):
        count_load_outcome(tmp_path / "dätä obj.data", content, outcomes)

    fuzz()
    print(f"fuzzed obj.data files: {sum(outcomes.values())} cases, by outcome: {outcomes}")
    assert sum(outcomes.values()) >= 200 and "loaded, 1 class" in outcomes


def test_train_with_names_shorter_than_the_classes_used_stops_with_one_sentence(tmp_path):
    folder = tmp_path / FOLDER
    make_dataset(folder)
    cfg = folder / "kurz.yaml"
    cfg.write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/val", "names": ["a", "b"]}))
    cmd = [sys.executable, "train.py", "--data", str(cfg), "--epochs", "1", "--device", "cpu", "--workers", "0"]
    result = subprocess.run([*cmd, "--out", str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True)
    sentence = result.stderr.strip().splitlines()[-1]
    print(sentence)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert sentence.startswith("error: none of the 2 train images is usable"), result.stderr[-3000:]
    assert "line 2: class 2 is beyond the dataset yaml's key 'names', which lists 2 classes" in sentence, sentence


# ---------------------------------------------------------------------------------------------
# Peak memory
# ---------------------------------------------------------------------------------------------

PEAK = """
import resource, sys
from utils.data.labels import load_verified
records = load_verified([sys.argv[1]], nc=1, split_name="train")
# VmHWM: this process's own peak; ru_maxrss starts at the parent's size (Linux keeps it across fork and exec)
try:
    with open("/proc/self/status") as f:
        peak = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), None)  # KB
except OSError:  # no /proc (macOS)
    peak = None
peak = peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"kept {len(records)}, peak memory {peak / 1024:.0f} MB")
assert peak < 1024 * 1024, peak
"""


def test_verifying_a_file_that_declares_900_megapixels_stays_under_1_gb(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user cache ø"))
    images = tmp_path / FOLDER / "images" / "train"
    png_declaring(images / "bomb.jpg", 30000, 30000)  # a lying suffix too
    Image.new("RGB", (32, 32)).save(images / "good.png")
    tiff = io.BytesIO()
    Image.new("RGB", (40, 30)).save(tiff, "TIFF")
    (images / "cut.tif").write_bytes(tiff.getvalue()[:-1700])  # PIL warned while reading its header
    checked = subprocess.run(
        [sys.executable, "-c", PEAK, str(images)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    print(checked.stdout.strip())
    assert checked.returncode == 0 and "kept 1," in checked.stdout, checked.stderr[-3000:]
    assert "900 megapixels" in checked.stderr and "bomb.jpg" in checked.stderr and "Traceback" not in checked.stderr
    assert "cut.tif  not a readable image" in checked.stderr and "Warning:" not in checked.stderr, checked.stderr
    assert MAX_PIXELS < 30000 * 30000
