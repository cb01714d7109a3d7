"""Every numeric flag of every sub-command: a value that makes no sense is one line naming the flag, exit 2,
nothing written, nothing loaded; never replaced by a default.

The flags are found in the real parsers, so a new numeric flag is tested by existing (and the first test
fails if it is added with a bare ``type=int``/``float``).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from hf_posext.commands import finetune
from hf_posext.commands.main import build_parser, main
from hf_posext.train.config import FIELD_CHECKS, TrainConfig

BAD = ["0", "-1", "x", "nan", "inf"]
#: The flags for which 0 makes sense (a seed, a key depth, no search round: the start scored; no position kept on
#: plain RoPE; zero-shot evaluation); every other numeric flag counts, sizes or scales.
ZERO_ALLOWED = {"--seed", "--depths", "--rounds", "--keep-first", "--num-fewshot"}


def numeric_flags() -> list[tuple[tuple[str, ...], str, typing.Any]]:
    found = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))
            elif action.option_strings and action.type not in (None, str) and action.dest != "set":
                found.append((path, action.option_strings[0], action.type))

    walk(build_parser(), ())
    return found


FLAGS = numeric_flags()
CASES = [(path, flag, value) for path, flag, _ in FLAGS for value in BAD if not (value == "0" and flag in ZERO_ALLOWED)]


def test_every_numeric_flag_is_checked_by_a_declared_range():
    assert len(FLAGS) >= 20
    unchecked = [f"{' '.join(path)} {flag}" for path, flag, kind in FLAGS if not getattr(kind, "checked", False)]
    assert not unchecked, f"numeric flags with a bare type (use arguments.whole/real): {unchecked}"


@pytest.mark.parametrize(("path", "flag", "value"), CASES, ids=[f"{' '.join(p)} {f} {v}" for p, f, v in CASES])
def test_a_nonsense_value_is_one_line_naming_the_flag(path, flag, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([*path, f"{flag}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {flag}" in err[0] and repr(value) in err[0], err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("path", "flag", "kind"), [case for case in FLAGS if case[1] in ZERO_ALLOWED])
def test_zero_is_taken_where_it_makes_sense(path, flag, kind):
    assert kind("0") in (0, [0.0])


def test_a_tiny_model_width_the_heads_cannot_split_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["tiny-model", "out", "--hidden-size", "12"])
    assert "multiple of 8" in capsys.readouterr().err and not list(tmp_path.iterdir())


RECIPE_NUMBERS = [
    f.name
    for f in dataclasses.fields(TrainConfig)
    if typing.get_type_hints(TrainConfig)[f.name] in (int, float, int | None, float | None)
]


@pytest.mark.parametrize("field", RECIPE_NUMBERS)
@pytest.mark.parametrize("value", ["x", "nan", "inf", "-1"])
def test_the_recipes_numbers_are_one_line_naming_the_setting(field, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--model", "m", "--dataset", "d.txt", "--output-dir", "out", f"--{field.replace('_', '-')}={value}"]
    try:
        code = finetune.main(argv)
    except SystemExit as exit_:  # argparse's own type check
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--{field.replace('_', '-')}" in err[0] and value in err[0], err
    assert not list(tmp_path.iterdir())
    assert FIELD_CHECKS[field].__name__ != "anything"
