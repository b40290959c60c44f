"""Moved to tools/sweep.py; this stub only says so."""

import shlex
import sys

sys.exit(f"sweep.py moved: run python tools/sweep.py {shlex.join(sys.argv[1:]) or 'SPEC.yaml'} instead")
