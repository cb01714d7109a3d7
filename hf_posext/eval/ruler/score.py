"""Scoring as RULER (``NVIDIA/RULER/scripts/eval/synthetic/constants.py``), with sample counts and 95% Wilson intervals.

``string_match_all``: the fraction of references found in the output (case-insensitive
substring); ``string_match_part``: 1 if any is found. A cell's accuracy is the mean over its
samples. Its interval is Wilson's score interval for that mean and the sample count: exact for
0/1 scores, and conservative for fractional ones (a score in [0, 1] with mean p has variance at
most p(1 - p)). The effective length is RULER's: the longest length up to which the average
stays above a threshold (85.6, Llama-2-7B's score at 4k), or one relative to the model's own
score at its training length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

#: RULER's threshold for the effective length: Llama-2-7B's average at 4k (in %).
RULER_THRESHOLD = 85.6

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's clean-up of an output: control characters become newlines, then strip."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """The fraction of ``references`` that occur in ``prediction`` (case-insensitive), in [0, 1]."""
    text = postprocess(prediction).lower()
    return sum(r.lower() in text for r in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any of ``references`` occurs in ``prediction`` (case-insensitive), else 0.0."""
    text = postprocess(prediction).lower()
    return float(any(r.lower() in text for r in references))


METRICS = {"all": string_match_all, "part": string_match_part}


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's score interval for a proportion ``successes / n`` (default: 95%).

    Args:
        successes: the number of successes (a sum of scores in [0, 1] is allowed).
        n: the number of trials.
        z: the normal quantile (1.96 for 95%).

    Returns:
        ``(low, high)`` in [0, 1].

    Raises:
        ValueError: ``n < 1`` or ``successes`` outside [0, n].
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n={n}], got {successes!r}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At p = 0 or 1 the bound is exactly 0 or 1; the formula leaves a rounding error there.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> tuple[int, int, float]:
    """The exact (binomial) McNemar test of two rows scored on the same prompts.

    Only the discordant prompts count: ``b`` that ``first`` gets right and ``second`` wrong, ``c``
    the reverse; under "the rows are equally good" b ~ Binomial(b + c, 1/2).

    Returns:
        ``(b, c, p)``: p is two-sided, ``min(1, 2 P[X <= min(b, c)])``; 1.0 with no discordant prompt.

    Raises:
        ValueError: rows of different lengths (they must be scored on the same prompts).
    """
    if len(first) != len(second):
        raise ValueError(f"the rows must hold the same prompts: {len(first)} vs {len(second)} results")
    b = sum(bool(x) and not bool(y) for x, y in zip(first, second))
    c = sum(bool(y) and not bool(x) for x, y in zip(first, second))
    n = b + c
    if n == 0:
        return b, c, 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return b, c, min(1.0, 2 * tail)


def summary(scores: Sequence[float]) -> dict[str, float | int]:
    """``{"accuracy", "n", "low", "high"}`` of per-sample scores in [0, 1], accuracy and bounds in %."""
    n = len(scores)
    if n == 0:
        raise ValueError("no scores to summarise")
    total = float(sum(scores))
    low, high = wilson_interval(min(max(total, 0.0), n), n)
    return {"accuracy": round(100 * total / n, 2), "n": n, "low": round(100 * low, 2), "high": round(100 * high, 2)}


def effective_length(
    lengths: Sequence[int], averages: Sequence[float | None], threshold: float = RULER_THRESHOLD
) -> int | None:
    """The longest length up to which every average is above ``threshold`` (RULER's effective length).

    Args:
        lengths: the tested lengths.
        averages: the average score (%) at each, ``None`` where not measured.
        threshold: in %; RULER's 85.6 by default.

    Returns:
        The length, or ``None`` when the shortest one is already at or below the threshold.
    """
    best = None
    for length, average in sorted(zip(lengths, averages), key=lambda item: item[0]):
        if average is None or average <= threshold:
            break
        best = length
    return best


__all__ = [
    "METRICS",
    "RULER_THRESHOLD",
    "effective_length",
    "postprocess",
    "string_match_all",
    "string_match_part",
    "summary",
    "mcnemar_exact",
    "wilson_interval",
]
