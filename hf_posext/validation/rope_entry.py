"""One rope-parameters entry checked: its type known, its required keys there, every value in range.

Split from `saved_model` (which checks whole configs and files with it) so that each reads in one sitting.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from .. import integration
from ..rope_utils import DYNAMIC_YARN_ROPE_TYPE, KEEP_FIRST_KEY, LONGROPE_KEEP_FIRST_ROPE_TYPE, PROPORTIONAL_ROPE_TYPE

#: The keys each rope type cannot do without (transformers' own validators require the same).
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    DYNAMIC_YARN_ROPE_TYPE: ("factor", "original_max_position_embeddings"),
    LONGROPE_KEEP_FIRST_ROPE_TYPE: ("short_factor", "long_factor", "original_max_position_embeddings", KEEP_FIRST_KEY),
    PROPORTIONAL_ROPE_TYPE: ("factors",),
}
#: Real-valued fields: (lower bound, whether the bound itself is allowed).
_REALS: dict[str, tuple[float, bool]] = {
    "factor": (1.0, True),
    "low_freq_factor": (0.0, False),
    "high_freq_factor": (0.0, False),
    "beta_fast": (0.0, False),
    "beta_slow": (0.0, False),
    "attention_factor": (0.0, False),
    "base_attention_factor": (0.0, False),
    "short_mscale": (0.0, False),
    "long_mscale": (0.0, False),
    "mscale": (0.0, True),
    "mscale_all_dim": (0.0, True),
}
#: Per-pair lists: one positive divisor per rotated channel pair.
_PAIR_LISTS = ("short_factor", "long_factor", "base_factors", "factors")


def is_real(value: Any) -> bool:
    """A finite real number, not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def is_whole(value: Any) -> bool:
    """An integer, not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def check_rope_entry(
    entry: Any,
    pairs: int | None,
    where: str = "rope_parameters",
    fallback: Callable[[str], Any] = lambda key: None,
    unknown_types: bool = False,
) -> None:
    """Check one rope-parameters entry: its type is known, its required keys are there, every value in range.

    Args:
        entry: the entry (``config.rope_parameters`` or one layer type's).
        pairs: rotated channel pairs (``rotary_dim // 2``) for the per-pair lists' length; ``None``: unknown.
        where: how the messages name the entry.
        fallback: a key the entry lacks, read from elsewhere (``original_max_position_embeddings`` at the
            config's top level, as Phi-3 keeps it).
        unknown_types: pass an entry whose rope type is not registered unchecked (a config.json before
            transformers reads it: model configs rename some, Phi-3's ``su``, Qwen2-VL's ``mrope``).

    Raises:
        ValueError: naming the field, its value and what is allowed.
    """
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping of rope fields (rope_type, rope_theta, ...), got {entry!r}")
    rope_type = entry.get("rope_type", entry.get("type", "default"))
    if not isinstance(rope_type, str) or not integration.is_registered_rope_type(rope_type):
        if unknown_types and isinstance(rope_type, str):
            return
        raise ValueError(
            f"{where}['rope_type'] must name a rope type transformers knows (default, linear, dynamic, "
            f"yarn, llama3, longrope, ... or one hf-posext registers), got {rope_type!r}"
        )
    for key in REQUIRED_KEYS.get(rope_type, ()):
        if entry.get(key) is None and fallback(key) is None:
            raise ValueError(f"{where} of rope_type {rope_type!r} needs {key!r} (it has {sorted(entry)})")
    original = _check_numbers(entry, where, fallback)
    _check_pair_lists(entry, where, pairs)
    _check_keep_first(entry, where, original)


def _check_numbers(entry: dict[str, Any], where: str, fallback: Callable[[str], Any]) -> Any:
    """The entry's single values: rope_theta, partial_rotary_factor, original_max_position_embeddings (or its
    ``fallback``), the real-valued fields (`_REALS`) and their orderings, ``truncate``. Returns the original
    context as given (``None`` when absent)."""
    theta = entry.get("rope_theta")
    if theta is not None and not (is_real(theta) and theta > 1):
        raise ValueError(f"{where}['rope_theta'] must be a finite number > 1, got {theta!r}")
    partial = entry.get("partial_rotary_factor")
    if partial is not None and not (is_real(partial) and 0 < partial <= 1):
        raise ValueError(f"{where}['partial_rotary_factor'] must be a number in (0, 1], got {partial!r}")
    original = entry.get("original_max_position_embeddings", fallback("original_max_position_embeddings"))
    if original is not None and not (is_whole(original) and original >= 1):
        raise ValueError(f"{where}['original_max_position_embeddings'] must be a positive integer, got {original!r}")
    for key, (bound, inclusive) in _REALS.items():
        value = entry.get(key)
        if value is None:
            continue
        if not (is_real(value) and (value >= bound if inclusive else value > bound)):
            raise ValueError(
                f"{where}['{key}'] must be a finite number {'>=' if inclusive else '>'} {bound:g}, got {value!r}"
            )
    low, high = entry.get("low_freq_factor"), entry.get("high_freq_factor")
    if low is not None and high is not None and high <= low:
        raise ValueError(
            f"{where}['high_freq_factor'] must be greater than low_freq_factor "
            f"({entry['low_freq_factor']!r}), got {entry['high_freq_factor']!r}"
        )
    beta_fast, beta_slow = entry.get("beta_fast") or 32.0, entry.get("beta_slow") or 1.0  # transformers' defaults
    if beta_fast <= beta_slow:
        raise ValueError(f"{where}['beta_fast'] must be greater than beta_slow ({beta_slow!r}), got {beta_fast!r}")
    if entry.get("truncate") is not None and not isinstance(entry["truncate"], bool):
        raise ValueError(f"{where}['truncate'] must be true or false, got {entry['truncate']!r}")
    return original


def _check_pair_lists(entry: dict[str, Any], where: str, pairs: int | None) -> None:
    """The per-pair lists (`_PAIR_LISTS`): positive numbers, ``pairs`` of them when that is known."""
    for key in _PAIR_LISTS:
        if entry.get(key) is None:
            continue
        values = entry[key]
        if not isinstance(values, list) or not all(is_real(v) and v > 0 for v in values):
            raise ValueError(
                f"{where}['{key}'] must be a list of positive numbers, one per rotated channel pair, got {values!r}"
            )
        if pairs is not None and len(values) != pairs:
            raise ValueError(
                f"{where}['{key}'] must have one entry per rotated channel pair ({pairs}), got {len(values)}"
            )


def _check_keep_first(entry: dict[str, Any], where: str, original: Any) -> None:
    """hf-posext's LongRoPE ``keep_first``: an int in ``[0, original)`` (``original``: the entry's context)."""
    kept = entry.get(KEEP_FIRST_KEY)
    if kept is not None and not (is_whole(kept) and kept >= 0 and (original is None or kept < original)):
        allowed = f"an int in [0, {original - 1}]" if isinstance(original, int) else "an int >= 0"
        raise ValueError(
            f"{where}['{KEEP_FIRST_KEY}'] must be {allowed} (positions kept on plain RoPE, within the "
            f"original context), got {kept!r}"
        )
