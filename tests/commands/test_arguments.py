"""``--set KEY=VALUE``: one parser behind ``hf-posext patch``, ``hf-posext eval`` and ``hf-posext finetune``."""

from __future__ import annotations

import argparse

import pytest

from hf_posext.commands.arguments import (
    KeyValueError,
    add_set_argument,
    method_kwargs,
    parse_bool,
    parse_key_value,
    parse_key_values,
    run_command,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("beta_fast=64", ("beta_fast", 64)),
        ("beta-slow=0.5", ("beta_slow", 0.5)),
        ("exact_cache=false", ("exact_cache", False)),
        ("backend=flex", ("backend", "flex")),
        ("scales=[1, 2]", ("scales", [1, 2])),
        ("name=a=b", ("name", "a=b")),
    ],
)
def test_values_are_json_when_they_parse_else_strings(text, expected):
    assert parse_key_value(text) == expected


@pytest.mark.parametrize("text", ["beta_fast", "=3", " =3"])
def test_malformed_items_are_named(text):
    with pytest.raises(KeyValueError, match=rf"--set expects KEY=VALUE .*got {text!r}"):
        parse_key_value(text)
    with pytest.raises(ValueError, match="expects KEY=VALUE"):  # what the CLIs' error handlers catch
        parse_key_values([text])


def test_later_keys_win_and_parsed_pairs_pass_through():
    assert parse_key_values(["a=1", ("b", 2), "a=3"]) == {"a": 3, "b": 2}
    assert parse_key_values(None) == {}


def test_argparse_reports_the_message_and_exits_2(capsys):
    parser = argparse.ArgumentParser(prog="tool")
    add_set_argument(parser)
    assert parser.parse_args(["--set", "beta_fast=64", "--set", "mode=tail"]).set == [
        ("beta_fast", 64),
        ("mode", "tail"),
    ]
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--set", "beta_fast"])
    assert exit_info.value.code == 2
    assert "--set expects KEY=VALUE (e.g. beta_fast=32), got 'beta_fast'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text,expected",
    [
        ("true", True),
        ("YES", True),
        ("1", True),
        (1, True),
        (True, True),
        ("False", False),
        ("no", False),
        ("0", False),
        (0, False),
    ],
)
def test_booleans_have_one_set_of_spellings(text, expected):
    assert parse_bool(text, "lora") is expected


@pytest.mark.parametrize("text", ["t", "y", "on", "", 2, None, 1.0])
def test_other_booleans_are_refused_naming_the_key(text):
    with pytest.raises(KeyValueError, match=rf"lora must be true or false \(or yes/no/1/0, any case\), got {text!r}"):
        parse_bool(text, "lora")


def test_factor_is_refused_in_method_arguments():
    assert method_kwargs(["beta-fast=64"]) == {"beta_fast": 64}
    with pytest.raises(KeyValueError, match=r"--set factor=8: factor has its own flag, use --factor 8"):
        method_kwargs(["beta_fast=64", "factor=8"])


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    monkeypatch.delenv("HF_POSEXT_DEBUG", raising=False)

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_command("tool", interrupted) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool: interrupted;") and "Traceback" not in err
    with pytest.raises(KeyboardInterrupt):  # --debug keeps the traceback
        run_command("tool", interrupted, debug=True)
