"""Moved to utils/data/shapes.py; this stub only says so."""

import shlex
import sys

sys.exit(f"utils/shapes.py moved: run python -m utils.data.shapes {shlex.join(sys.argv[1:])}".rstrip())
