"""Where the peer Ultralytics environment is (made by `bench/peer_env.sh DIR`): its python for the scripts that call
it, its config dir for the scripts that run in it. Nothing here imports ultralytics."""

import os
import sys
from pathlib import Path

CONFIG = "yolo-config"  # bench/peer_env.sh DIR puts Ultralytics' settings.json and Arial.ttf under DIR/yolo-config
SETUP = "make one with bench/peer_env.sh DIR (Ultralytics in a venv of its own, set up to run offline)"


def find_peer_python(flag):
    """The peer environment's python: the --peer-python flag, else $PEER_PYTHON; one sentence and exit without."""
    python = flag or os.environ.get("PEER_PYTHON")
    if not python:
        sys.exit(f"no peer Ultralytics python: {SETUP}, then set PEER_PYTHON=DIR/bin/python or pass --peer-python")
    if not Path(python).is_file():
        sys.exit(f"peer python {python} (--peer-python or PEER_PYTHON) does not exist: {SETUP}")
    return python


def use_peer_config():
    """Point Ultralytics at its config dir before it is imported (it reads YOLO_CONFIG_DIR at import): the one
    YOLO_CONFIG_DIR names, else the one bench/peer_env.sh made in the venv this python runs from."""
    if os.environ.get("YOLO_CONFIG_DIR"):
        return
    config = Path(sys.prefix) / CONFIG
    # without it Ultralytics would write its settings to ~/.config and try to download a font, which fails offline
    if not config.is_dir():
        sys.exit(f"{sys.executable} is not a peer environment ({config} is missing): {SETUP} and run DIR/bin/python")
    os.environ["YOLO_CONFIG_DIR"] = str(config)
