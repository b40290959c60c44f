"""The sweep spec (see tools/sweep.py's docstring): reading and checking it, the experiments its grids expand to,
their folder names and command lines, and what each experiment folder still has to run."""

import hashlib
import itertools
import json
import re
import shlex
import sys
from pathlib import Path

import yaml

from utils.general import write_text_atomic

BUILTINS = ("_output", "_name", "_gpus")
SPEC_KEYS = ("template", "default", "resource", "alias", "output", "slurm")
TIME = "%Y-%m-%d %H:%M:%S"
# {name} and [name]; the (?<!\$) leaves the shell's own ${VAR} alone.
PLACEHOLDER = re.compile(r"(?<!\$)\{(\w+)\}|\[(\w+)\]")


class SpecError(Exception):
    """A mistake in the spec or the command line: one sentence on stderr, exit code 2."""


def load_spec(path):
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except OSError as e:
        raise SpecError(f"cannot read spec {path}: {e.strerror}")
    except yaml.YAMLError as e:
        raise SpecError(f"spec {path} is not valid YAML: {' '.join(str(e).split())}")
    if not docs or not isinstance(docs[0], dict):
        raise SpecError(f"the first document of {path} must be a mapping with 'template' and 'default'")
    spec, grids = docs[0], docs[1:]
    for key in spec:
        if key not in SPEC_KEYS:
            raise SpecError(f"unknown key '{key}' in the spec (expected {', '.join(SPEC_KEYS)})")
    template, default, alias = spec.get("template"), spec.get("default"), spec.get("alias") or {}
    if not isinstance(template, dict) or not template or not all(isinstance(c, str) for c in template.values()):
        raise SpecError("the spec needs 'template': a mapping from command name to command line")
    if not isinstance(default, dict):
        raise SpecError("the spec needs 'default': a mapping from every parameter to its baseline value")
    if not isinstance(alias, dict) or not all(
        isinstance(values, dict) and all(isinstance(m, dict) for m in values.values()) for values in alias.values()
    ):
        raise SpecError("'alias' must map a parameter to {value: {parameter: value, ...}, ...}")
    for name, command in template.items():
        for key in placeholders(command):
            if key not in default and key not in BUILTINS:
                raise SpecError(
                    f"placeholder '{key}' in template command '{name}' is neither a parameter "
                    f"in 'default' nor a built-in ({', '.join(BUILTINS)})"
                )
    for i, grid in enumerate(grids, 1):
        if not isinstance(grid, dict):
            raise SpecError(f"grid document {i} must be a mapping of parameter: [values]")
        for key, values in grid.items():
            if str(key).startswith("_") and key not in ("_title", "_cmd", "_slurm"):
                raise SpecError(f"unknown key '{key}' in grid document {i} (only _title, _cmd and _slurm start with _)")
            if isinstance(values, list) and not values:
                raise SpecError(f"parameter '{key}' in grid document {i} has an empty list of values")
        if "_cmd" in grid:
            grid["_cmd"] = check_commands(grid["_cmd"], template, f"_cmd of grid document {i}")
        if not isinstance(grid.get("_slurm", {}), dict):
            raise SpecError(f"_slurm of grid document {i} must be a mapping of sbatch options")
    if not isinstance(spec.get("slurm") or {}, dict):
        raise SpecError("'slurm' must be a mapping of sbatch options, e.g. {partition: gpu, time: '1:00:00'}")
    spec["alias"] = alias
    return spec, grids


def placeholders(command):
    return [m.group(1) or m.group(2) for m in PLACEHOLDER.finditer(command)]


def check_commands(names, template, where):
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names:
        raise SpecError(f"{where} must list template commands ({', '.join(template)})")
    for name in names:
        if name not in template:
            raise SpecError(f"{where} names command '{name}', which is not in the template ({', '.join(template)})")
    return names


def parse_resources(entries):
    if not isinstance(entries, list) or not entries:
        raise SpecError("the spec needs 'resource': a list of workers such as [0, 1, \"2,3\", cpu] (or pass -r)")
    workers = []
    for entry in entries:
        text = str(entry).replace(" ", "").lower()
        # bool is an int to Python, but "true" is no GPU id
        if (
            isinstance(entry, bool)
            or not isinstance(entry, (int, str))
            or not (text == "cpu" or re.fullmatch(r"\d+(,\d+)*", text))
        ):
            raise SpecError(f'resource {entry!r} is neither a GPU id (0), GPU ids ("0,1") nor cpu')
        workers.append(text)
    return workers


def select_titles(grids, titles):
    if not titles:
        return grids
    for title in titles:
        if not any(str(g.get("_title")) == title for g in grids):
            raise SpecError(f"no grid document has _title '{title}'")
    return [g for g in grids if str(g.get("_title")) in titles]


def expand(spec, grids, only_commands):
    """Every experiment of the grids, once each, as dicts with name, params and commands."""
    template, default, alias = spec["template"], spec["default"], spec["alias"]
    by_params, by_name = {}, {}
    for grid in grids or [{}]:  # a spec without grids runs the defaults once
        keys = [k for k in grid if not str(k).startswith("_")]
        choices = [grid[k] if isinstance(grid[k], list) else [grid[k]] for k in keys]
        wanted = only_commands or grid.get("_cmd") or list(template)
        for combo in itertools.product(*choices):
            chosen = dict(zip(keys, combo))
            implied = dict(default)
            for key, value in chosen.items():
                implied.update(lookup_alias(alias, key, value))
            params = {**implied, **chosen}  # a value the grid writes beats one an alias implies
            # Name only what the grid changed, measured against what its aliases imply,
            # so data: coco reads as Data_coco rather than Data_coco-Imgsz_640.
            name = folder_name([(k, chosen[k]) for k in keys if k not in implied or chosen[k] != implied[k]])
            canon = json.dumps(params, sort_keys=True, default=str)
            if by_name.get(name, {"canon": canon})["canon"] != canon:
                raise SpecError(
                    f"two different experiments would share the folder '{name}'; "
                    "set the parameter that tells them apart in the grid"
                )
            exp = by_params.get(canon)  # the same experiment from another grid runs once
            if exp is None:
                # sbatch options: the spec's, then the grid's; the first grid naming the experiment wins
                slurm = {**(spec.get("slurm") or {}), **grid.get("_slurm", {})}
                exp = {"name": name, "params": params, "canon": canon, "commands": [], "slurm": slurm}
                by_params[canon] = by_name[name] = exp
            exp["commands"] = [c for c in template if c in exp["commands"] or c in wanted]
    return list(by_params.values())


def lookup_alias(alias, key, value):
    try:
        return alias.get(key, {}).get(value, {})
    except TypeError:  # a list value cannot be an alias
        return {}


def folder_name(parts):
    if not parts:
        return "default"
    name = "-".join(f"{str(k)[:1].upper()}{str(k)[1:]}_{show(v)}" for k, v in parts)
    name = re.sub(r"[^\w.,=+-]", "_", name)  # no slashes, spaces or shell-special characters
    if len(name) > 200:  # file names stop at 255 bytes; the hash keeps shortened names apart
        name = name[:180] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def show(value):
    return ",".join(show(v) for v in value) if isinstance(value, list) else str(value)


def render(command, params):
    def replace(match):
        key = match.group(1) or match.group(2)
        value = params[key]
        if match.group(1):
            return quote(value)
        if value is None or value is False:
            return ""
        return f"--{key}" if value is True else f"--{key} {quote(value)}"

    return PLACEHOLDER.sub(replace, command)


def quote(value):
    if isinstance(value, list):  # for nargs='+' options: --imgsz 640 480
        return " ".join(quote(v) for v in value)
    return "" if value is None else shlex.quote(str(value))


def read_json(path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_json(path, data):
    # readers (tools/sweep.py table, a rerun) never see half a file
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def still_to_run(exp, force):
    """The commands of exp to run now: everything from the first one that has not succeeded."""
    old = read_json(exp["dir"] / "param")
    if old is not None and old != json.loads(exp["canon"]):
        # The folder name only records differences from the defaults, so editing
        # 'default' can point a name at new values: its old results are stale.
        print(f"note: parameters of {exp['dir']} changed since its last run, running it again", file=sys.stderr)
        force = True
    stat = read_json(exp["dir"] / "stat", {})
    todo = []
    for command in exp["commands"]:
        # Once a command runs again, the later ones must too: they read its output.
        if force or todo or stat.get(command, {}).get("status") != "success":
            todo.append(command)
    return todo
