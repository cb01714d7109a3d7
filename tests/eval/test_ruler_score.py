"""RULER scoring on hand-written outputs, the Wilson interval against published values, effective length."""

from __future__ import annotations

import pytest

from hf_posext.eval.ruler import (
    effective_length,
    mcnemar_exact,
    string_match_all,
    string_match_part,
    summary,
    wilson_interval,
)


@pytest.mark.parametrize(
    "output,references,score",
    [
        (" 1234567.", ["1234567"], 1.0),  # right
        ("The number is 1234567, and also 7654321.", ["1234567"], 1.0),  # right, with extra text
        (" 1234567 and 2222222", ["1234567", "2222222", "3333333", "4444444"], 0.5),  # partial: 2 of 4
        (" 7654321", ["1234567"], 0.0),  # wrong
        ("", ["1234567"], 0.0),  # nothing
        (" 123456", ["1234567"], 0.0),  # a prefix is not the answer
    ],
)
def test_string_match_all(output, references, score):
    assert string_match_all(output, references) == score


def test_matching_ignores_case_and_control_characters():
    assert string_match_all("Answer:\tABCDE\x00qwert", ["abcde", "QWERT"]) == 1.0
    assert string_match_all("  vdrhc  ", ["VDRHC", "XYZZY", "ABCDE", "FGHIJ"]) == 0.25
    assert string_match_part("It is Velqualin.", ["velqualin", "other"]) == 1.0
    assert string_match_part("No idea.", ["velqualin"]) == 0.0


@pytest.mark.parametrize(
    "successes,n,low,high",
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", table I, method 3.
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_interval_matches_published_values(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_edges_and_bad_input():
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    with pytest.raises(ValueError, match="n must be a positive int"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"successes must lie in \[0, n=3\]"):
        wilson_interval(4, 3)


def test_mcnemar_exact_counts_discordant_prompts_and_matches_the_binomial():
    # b = 3, c = 0: p = 2 * 0.5**3 = 0.25 (the Self-Extend vs YaRN pair at 16k, stop 27).
    first = [True] * 9 + [False]
    second = [True] * 6 + [False] * 4
    assert mcnemar_exact(first, second) == (3, 0, 0.25)
    # b = 1, c = 5: p = 2 * (1 + 6) / 64.
    assert mcnemar_exact([1, 0, 0, 0, 0, 0, 1], [0, 1, 1, 1, 1, 1, 1]) == (1, 5, 14 / 64)
    assert mcnemar_exact([True, False], [True, False]) == (0, 0, 1.0)
    assert mcnemar_exact([True] * 4, [False] * 4)[2] == 0.125
    with pytest.raises(ValueError, match="same prompts: 2 vs 3"):
        mcnemar_exact([True, True], [True, True, False])


def test_summary_reports_percent_count_and_bounds():
    low, high = wilson_interval(2.5, 4)
    assert summary([1, 1, 0, 0.5]) == {
        "accuracy": 62.5,
        "n": 4,
        "low": round(100 * low, 2),
        "high": round(100 * high, 2),
    }
    with pytest.raises(ValueError, match="no scores"):
        summary([])


def test_effective_length():
    lengths = [4096, 8192, 16384, 32768]
    assert effective_length(lengths, [95.0, 90.0, 80.0, 88.0]) == 8192  # the first drop ends it
    assert effective_length(lengths, [80.0, 90.0, 95.0, 95.0]) is None
    assert effective_length(lengths, [99.0, 99.0, 99.0, 99.0]) == 32768
    assert effective_length(lengths, [60.0, 50.0, 10.0, 0.0], threshold=45.0) == 8192
    assert effective_length([8192, 4096], [10.0, 90.0]) == 4096  # order of the input does not matter
