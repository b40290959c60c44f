"""The hyperparameter table as a user reads it (issue 79): each flag's --help says what it is and what `auto`
becomes, `auto` and numbers both parse, and the fine-tuning table answers every run length with one row."""

import argparse
import runpy
import sys
from pathlib import Path

import pytest

from utils.data.dataset_yaml import DatasetError
from utils.hyperparameters import DEFAULTS, FINE_TUNING, HYP, SCRATCH, flag_type, is_auto
from utils.settings import apply_dataset_defaults

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_has_its_help_and_every_auto_says_what_it_becomes():
    for key, (value, text) in HYP.items():
        assert len(text) > 10 and text != "hyperparameter", key
        assert DEFAULTS[key] == value
        if value == "auto":
            assert "auto:" in text, key  # what auto picks, in --help itself
    auto = {key for key, (value, _) in HYP.items() if value == "auto"} - {"optimizer"}
    assert all(set(row) == auto for row in SCRATCH.values())  # every auto number has a value in each row
    assert all(set(values) <= auto for _, _, values, _ in FINE_TUNING)


def test_auto_and_numbers_both_parse_and_anything_else_is_one_sentence():
    assert flag_type("lr0")("0.02") == 0.02 and isinstance(flag_type("lr0")("1"), float)
    assert flag_type("lr0")("auto") == "auto" and flag_type("nominal_batch")("64") == 64
    assert flag_type("optimizer")("sgd") == "sgd" and flag_type("mosaic") is float and flag_type("close_mosaic") is int
    with pytest.raises(ValueError):
        flag_type("nominal_batch")("6.5")
    assert is_auto("lr0", "auto") and is_auto("lr0", 0.0) and is_auto("nominal_batch", 0)  # 0: old last.pt files
    assert not is_auto("warmup_bias_lr", 0.0) and not is_auto("lr0", 0.002)
    code, _, err = run_train(["--lr0", "fast"])
    assert code == 2 and "argument --lr0: invalid float or auto value: 'fast'" in err


def test_help_shows_auto_with_what_it_becomes_and_the_fine_tuning_table():
    code, out, _ = run_train(["--help"])
    text = " ".join(out.split())  # argparse wraps at the terminal's width
    assert code == 0
    assert "--lr0 LR0 initial learning rate; auto: SGD and MuSGD 0.01, AdamW 0.002" in text
    assert "(default: auto)" in text and "hyperparameter (default" not in text
    assert "the fine-tuning table: auto in an AdamW run from --weights" in text
    for when, _, values, why in FINE_TUNING:  # each row, with its values and its reason
        shown = ", ".join(f"{key} {value}" for key, value in values.items())
        assert f"{when.format(n='n', w='w')}: {shown} why: {why}" in text


def test_the_fine_tuning_table_gives_each_run_length_one_row():
    for warmup in (0, 100, 150):
        rows = [next(i for i, row in enumerate(FINE_TUNING) if row[1](n, warmup)) for n in range(1, 400)]
        assert rows == sorted(rows)  # longer runs never go back to a shorter one's row
        if warmup == 100:
            assert rows[148] == 0 and rows[149] == 1  # n < 1.5 w


def test_a_dataset_yaml_sets_an_auto_setting_to_a_number_or_to_auto():
    parser = argparse.ArgumentParser()
    for key in ("lr0", "nominal_batch", "epochs"):
        parser.add_argument(f"--{key}", type=flag_type(key) if key in HYP else int, default=HYP.get(key, (5,))[0])
    args = parser.parse_args([])
    data = {"yaml": "d.yaml", "defaults": {"lr0": 0.005, "nominal_batch": "auto", "epochs": "7"}}
    apply_dataset_defaults(args, parser, data, given_flags=set())
    assert (args.lr0, args.nominal_batch, args.epochs) == (0.005, "auto", 7)
    with pytest.raises(
        DatasetError, match=r"d.yaml: key 'defaults' sets 'nominal_batch' to 'many', which is not a int or"
    ):
        apply_dataset_defaults(args, parser, {**data, "defaults": {"nominal_batch": "many"}}, given_flags=set())


def run_train(argv):
    """(exit code, stdout, stderr) of train.py run with `argv` that exits while parsing them, in this process (the
    parser is all that runs: nothing is trained or written)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = [str(ROOT / "train.py"), *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit:
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        sys.argv = saved
    return exit.value.code, out.getvalue(), err.getvalue()
