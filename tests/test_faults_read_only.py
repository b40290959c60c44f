"""A folder that cannot be written (issue 40): --out on a read-only folder stops with one sentence, and a read-only
dataset trains with its label cache in the user's cache folder.
"""

import contextlib
import os
import subprocess

import pytest
from train_runs import TINY, run

from utils.data.shapes import make_shapes


@contextlib.contextmanager
def read_only(folder):
    """`folder` read-only while the context lasts: bind-mounted read-only onto itself where this user may mount
    (root, whom file modes do not stop), else its modes without write permission."""
    if os.geteuid() != 0:
        folders = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
        for p in folders:
            p.chmod(0o555)
        try:
            yield
        finally:
            for p in folders:
                p.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode:
        pytest.skip("root without mount: no read-only folder can be made here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_out_on_a_read_only_folder_stops_with_one_sentence(tmp_path):
    locked = tmp_path / "read_only"
    locked.mkdir()
    data = tmp_path / "never_read.yaml"  # a file, so that the check of every file a run needs passes it
    data.write_text("path: none\ntrain: images\nval: images\nnames: [a]\n")
    with read_only(locked):
        stopped = run(["--data", data, "--out", locked / "run", *TINY], check=False)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    sentence = stopped.stderr.strip().splitlines()[-1]
    print(sentence)
    assert sentence.startswith(f"--out: {locked / 'run'} could not be written (")
    assert "read-only" in sentence or "permission denied" in sentence
    assert sentence.endswith("give --out a folder this user can write in")


def test_a_read_only_dataset_trains_with_its_label_cache_in_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user_cache"))
    make_shapes(tmp_path / "shapes", n_train=2, n_val=1, size=64)
    data = tmp_path / "tiny.yaml"
    data.write_text("path: shapes\ntrain: images/train\nval: images/val\nnames: [a, b, c, d, e, f]\n")
    with read_only(tmp_path / "shapes"):
        trained = run(["--data", data, "--epochs", "1", "--out", tmp_path / "run", *TINY])
    assert "Traceback" not in trained.stderr
    notes = [line for line in (trained.stdout + trained.stderr).splitlines() if "label cache" in line]
    print(*notes, sep="\n")
    assert notes and all(str(tmp_path / "user_cache") in line for line in notes)
    assert len(list((tmp_path / "user_cache").glob("*.cache.npz"))) == 2  # train and val
    assert not list((tmp_path / "shapes").rglob("*.cache.npz"))
