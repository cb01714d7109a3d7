"""The shared value checks: what each accepts, what it returns, and the message of what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from hf_posext.validation import (
    choice,
    integer,
    mapping,
    number,
    optional,
    parse_bool,
    real_number,
    required,
    whole_number,
)


def test_real_number_takes_numpy_scalars_and_refuses_booleans_and_infinities():
    assert real_number("yarn", "beta_fast", np.float32(32), "> 0") == 32.0
    assert type(real_number("", "x", 3, "> 0")) is float
    for bad in (True, float("inf"), float("nan"), "3", None):
        with pytest.raises(ValueError, match=r"^yarn: beta_fast must be a finite number > 0, got "):
            real_number("yarn", "beta_fast", bad, "> 0")
    with pytest.raises(ValueError, match=r"^x must be a finite number"):  # no owner: no prefix
        real_number("", "x", "3", "> 0")


def test_whole_number_takes_numpy_integers_above_the_minimum():
    assert whole_number("m", "n", np.int64(4), 1, "a positive int") == 4
    for bad in (0, True, 2.0, "2"):
        with pytest.raises(ValueError, match=r"^m: n must be a positive int, got "):
            whole_number("m", "n", bad, 1, "a positive int")


@pytest.mark.parametrize("text, expected", [("True", True), (" no ", False), ("1", True), (0, False), (True, True)])
def test_parse_bool_spellings(text, expected):
    assert parse_bool(text, "lora") is expected


@pytest.mark.parametrize("text", ["t", "off", 2, None, ""])
def test_parse_bool_refuses_everything_else(text):
    with pytest.raises(ValueError, match=r"lora must be true or false \(or yes/no/1/0, any case\)"):
        parse_bool(text, "lora")


@pytest.mark.parametrize(
    "check, good, bad, message",
    [
        (integer(1), [1, np.int32(7)], [0, True, 1.0], r"n must be an integer >= 1, got "),
        (number(0, low_open=True), [1e-9, 3], [0, -1.0, True, float("nan")], r"n must be a positive number, got "),
        (number(0), [0, 2.5], [-0.1, float("inf")], r"n must be a number >= 0, got "),
        (number(0, 1, high_open=True), [0, 0.99], [1, 1.5, -0.01], r"n must be in \[0, 1\), got "),
        (choice(("a", "b")), ["a"], ["c", None], r"n must be one of a, b; got "),
        (required("say what"), ["x", [1]], ["", []], r"n is required: say what"),
        (optional(integer(2)), [None, 2], [1], r"n must be an integer >= 2, got 1"),
        (mapping(), [{}], [[("a", 1)]], r"n must be a mapping, got "),
    ],
)
def test_check_builders(check, good, bad, message):
    for value in good:
        assert check("n", value) == value
    for value in bad:
        with pytest.raises(ValueError, match=message):
            check("n", value)
