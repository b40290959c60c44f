"""A verified dataset split held as a few flat numpy arrays instead of a list of dicts of lists.

Why: every data-loader worker (and every DDP rank) is a forked copy of the main process. A list of
118k dicts holding 860k small lists is millions of Python objects; merely reading them updates their
reference counts, which writes to their memory pages, so each worker slowly ends up with its own copy
(about 250 MB for COCO, times workers, times ranks). Four numpy arrays have four reference counts: the
pages holding the data are only read, and stay shared.

records[i] still gives what the rest of the code reads, a dict {"im": path, "shape": [h, w], "labels":
(k, 5) float32 array of [class, x1, y1, x2, y2] normalised corners}, built on the fly and dropped after.
A VOC or COCO json split (utils/data/voc.py, utils/data/coco_json.py) also keeps each image's "ignored" boxes (VOC's
`difficult`, COCO's `iscrowd`: scored as regions to ignore, never trained on) and, for a json, its "image_id";
YOLO records have neither (None), and their cache file is the same as before these existed.
"""

import json

import numpy as np

FIELDS = ("path_bytes", "path_offsets", "shapes", "labels", "label_offsets")
EXTRA_FIELDS = ("ignored", "ignored_offsets", "image_ids")  # VOC and COCO json only


class Records:
    def __init__(self, path_bytes, path_offsets, shapes, labels, label_offsets, extra=None):
        self.path_bytes = path_bytes  # uint8: every path, utf-8, one after another
        self.path_offsets = path_offsets  # int64 (n + 1,): path i is path_bytes[o[i]:o[i + 1]]
        self.shapes = shapes  # int32 (n, 2): height, width as read (EXIF orientation applied)
        self.labels = labels  # float32 (boxes, 5): class, x1, y1, x2, y2, normalised
        self.label_offsets = label_offsets  # int64 (n + 1,): image i's rows are labels[o[i]:o[i + 1]]
        extra = extra or {}
        self.ignored = extra.get("ignored")  # float32 (boxes, 5) like labels, or None
        self.ignored_offsets = extra.get("ignored_offsets")  # int64 (n + 1,), or None
        self.image_ids = extra.get("image_ids")  # int64 (n,): the COCO json's image id (-1: none), or None

    @classmethod
    def from_dicts(cls, records):
        encoded = [str(r["im"]).encode() for r in records]
        rows = [np.asarray(r["labels"], dtype=np.float32).reshape(-1, 5) for r in records]
        extra = None
        if any("ignored" in r for r in records):
            ignored = [np.asarray(r.get("ignored", []), dtype=np.float32).reshape(-1, 5) for r in records]
            extra = {
                "ignored": np.concatenate(ignored),
                "ignored_offsets": np.cumsum([0] + [len(r) for r in ignored], dtype=np.int64),
                "image_ids": np.array([r.get("image_id", -1) for r in records], dtype=np.int64),
            }
        return cls(
            np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(),
            np.cumsum([0] + [len(e) for e in encoded], dtype=np.int64),
            np.array([r["shape"] for r in records], dtype=np.int32).reshape(-1, 2),
            np.concatenate(rows) if rows else np.zeros((0, 5), np.float32),
            np.cumsum([0] + [len(r) for r in rows], dtype=np.int64),
            extra,
        )

    def extra(self):
        """The VOC / COCO json fields as a dict, or None for a YOLO split."""
        return None if self.ignored is None else {f: getattr(self, f) for f in EXTRA_FIELDS}

    def __len__(self):
        return len(self.shapes)

    def path(self, i):
        return bytes(self.path_bytes[self.path_offsets[i] : self.path_offsets[i + 1]]).decode()

    def labels_of(self, i):
        return self.labels[self.label_offsets[i] : self.label_offsets[i + 1]]

    def ignored_of(self, i):
        """Image i's boxes to ignore in scoring (VOC difficult, COCO crowd); none for a YOLO split."""
        if self.ignored is None:
            return np.zeros((0, 5), np.float32)
        return self.ignored[self.ignored_offsets[i] : self.ignored_offsets[i + 1]]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.take(range(len(self))[key])
        if not -len(self) <= key < len(self):
            raise IndexError(f"record {key} of {len(self)}")
        i = key % len(self)
        record = {"im": self.path(i), "shape": self.shapes[i].tolist(), "labels": self.labels_of(i)}
        if self.ignored is not None:
            record.update(ignored=self.ignored_of(i), image_id=int(self.image_ids[i]))
        return record

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __eq__(self, other):
        if not isinstance(other, Records) or (self.ignored is None) != (other.ignored is None):
            return False
        fields = FIELDS + (EXTRA_FIELDS if self.ignored is not None else ())
        return all(np.array_equal(getattr(self, f), getattr(other, f)) for f in fields)

    def take(self, indices):
        """The records at these positions, in this order, as a new Records."""
        indices = np.asarray(indices, dtype=np.int64)
        if not len(indices):
            return Records.from_dicts([])
        rows = np.concatenate([np.arange(self.label_offsets[i], self.label_offsets[i + 1]) for i in indices])
        paths = [self.path_bytes[self.path_offsets[i] : self.path_offsets[i + 1]] for i in indices]
        counts = self.label_offsets[indices + 1] - self.label_offsets[indices]
        extra = None
        if self.ignored is not None:
            spans = [np.arange(self.ignored_offsets[i], self.ignored_offsets[i + 1]) for i in indices]
            extra = {
                "ignored": self.ignored[np.concatenate(spans)].reshape(-1, 5),
                "ignored_offsets": np.cumsum(np.r_[0, [len(s) for s in spans]], dtype=np.int64),
                "image_ids": self.image_ids[indices],
            }
        return Records(
            np.concatenate(paths),
            np.cumsum(np.r_[0, [len(p) for p in paths]], dtype=np.int64),
            self.shapes[indices],
            self.labels[rows].reshape(-1, 5),
            np.cumsum(np.r_[0, counts], dtype=np.int64),
            extra,
        )

    def single_class(self):
        labels = self.labels.copy()
        labels[:, 0] = 0
        extra = self.extra()
        if extra is not None:  # an ignored region stays ignored, whatever its class
            extra["ignored"] = extra["ignored"].copy()
            extra["ignored"][:, 0] = 0
        return Records(self.path_bytes, self.path_offsets, self.shapes, labels, self.label_offsets, extra)

    def save(self, file, meta):
        """Into an .npz (uncompressed, no pickles): the arrays, and `meta` (a JSON-able dict) as a string."""
        np.savez(
            file,
            path_bytes=self.path_bytes,
            path_offsets=self.path_offsets,
            shapes=self.shapes,
            labels=self.labels,
            label_offsets=self.label_offsets,
            meta=np.array(json.dumps(meta)),
            **(self.extra() or {}),
        )

    @classmethod
    def load(cls, file):
        """(Records, meta) from save()'s file. Raises OSError / ValueError / KeyError when it is not one."""
        with np.load(file, allow_pickle=False) as z:
            extra = {k: z[k] for k in EXTRA_FIELDS} if "ignored" in z.files else None
            return cls(*(z[k] for k in FIELDS), extra), json.loads(str(z["meta"]))


def as_records(records):
    """Records as they are, or a list of record dicts made into Records."""
    return records if isinstance(records, Records) else Records.from_dicts(records)
