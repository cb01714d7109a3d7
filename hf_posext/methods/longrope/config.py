"""LongRoPE: one rescale factor per rotary pair, short factors up to L_orig and long ones past it.

Ding et al. 2024, arXiv:2402.13753 (microsoft/LongRoPE). Written as transformers' native
``longrope`` entry, so vanilla transformers, vLLM and SGLang load the checkpoint; with
``keep_first=n`` (the paper's n-hat: the first n positions on plain RoPE past the switch) as
hf-posext's own rope type (`rope`), which needs ``import hf_posext``. The exact KV cache
across the switch, the default factors and the search: docs/methods/longrope.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...rope_utils import KEEP_FIRST_KEY, LONGROPE_KEEP_FIRST_ROPE_TYPE, default_inv_freq, yarn_pair_factors
from ..base import BaseRope, real_number, whole_number
from ..dynamic import ExactCacheOption


#: What picks a position's factors: the whole sequence's length (transformers') or its query's (hf-posext's own).
FACTORS_BY = ("sequence", "query")


def yarn_long_factors(theta: float, rotary_dim: int, original: int, factor: float) -> list[float]:
    """LongRoPE's starting point: YaRN's per-pair ramp as divisors, ``rotary_dim // 2`` of them.

    Pair i's frequency theta^(-2i/d) is divided by 1 (pairs making more than 32 turns over
    ``original``) up to ``factor`` (fewer than 1 turn), linear in i between (YaRN's ramp as
    transformers computes it): non-decreasing, between 1 and ``factor``.
    """
    inv_freq = default_inv_freq(theta, rotary_dim).double()
    return [float(f) for f in yarn_pair_factors(inv_freq, original, factor)]


def longrope_attention_factor(factor: float, original: int) -> float:
    """transformers' default cos/sin multiplier of ``longrope``, sqrt(1 + ln s / ln L_orig) (1 for s <= 1)."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _factor_list(name: str, field: str, given: Any) -> tuple[float, ...] | None:
    if given is None:
        return None
    if isinstance(given, torch.Tensor):
        given = given.tolist()
    if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
        raise ValueError(
            f"{name}: {field} must be a list of positive numbers (one per rotary pair) or None, got {given!r}"
        )
    values = tuple(real_number(name, field, v, "a list of positive numbers") for v in given)
    bad = [v for v in values if not (v > 0 and math.isfinite(v))]
    if not values or bad:
        raise ValueError(f"{name}: {field} must be a non-empty list of positive finite numbers, got {list(given)!r}")
    return values


def check_keep_first(name: str, keep_first: int, original: int) -> None:
    """Refuse ``keep_first`` outside ``[0, original)``: the kept positions lie within the pretraining context.

    Raises:
        ValueError: naming the value and what is allowed.
    """
    if not 0 <= keep_first < original:
        raise ValueError(
            f"{name}: keep_first must be an int in [0, {original - 1}] (the first n positions keep plain "
            f"RoPE past the switch; they lie within the original context {original}), got {keep_first!r}"
        )


@dataclass(frozen=True)
class LongRopeConfig(ExactCacheOption):
    """LongRoPE: per-pair factors, short ones up to L_orig and long ones past it (native ``longrope``).

    Args:
        long_factor: one divisor per rotary pair used past L_orig; ``None``: YaRN's ramp at ``factor``
            (`yarn_long_factors`), what LongRoPE's search starts from
            ([`hf_posext.search_longrope`][hf_posext.search_longrope]).
        short_factor: the divisors up to L_orig; ``None``: ones (the model as pretrained).
        attention_factor: the cos/sin multiplier; ``None``: transformers' sqrt(1 + ln s / ln L_orig).
        keep_first: past the switch, positions ``0 .. keep_first - 1`` rotate with plain RoPE (no factor,
            cos/sin multiplier 1), the paper's n-hat; 0 (the default) is transformers' ``longrope``. A value
            above 0 writes hf-posext's own rope type, which only transformers with ``import hf_posext``
            reads (vLLM, SGLang, llama.cpp and a vanilla transformers refuse it).
        exact_cache: cached decoding across the switch equals a forward pass (docs/methods/longrope.md): at the
            forward that crosses L_orig the cache's prefix is computed again with the long factors. ``False``:
            transformers' cache, whose keys and values from before the switch keep the short factors.
        factors_by: ``"sequence"`` (the default): the sequence's length picks the factors of every position, as
            transformers' ``longrope`` and every other reader of the checkpoint compute it (Phi-3's training).
            ``"query"``: each query with the factors of its own prefix's length, so past L_orig the rows before
            it keep the short factors (hf-posext's own definition, which no other reader computes; needs
            ``exact_cache=True``).
    """

    paper = "Ding et al. 2024, LongRoPE, arXiv:2402.13753"
    composes = True
    #: the exact cache needs one flat rope entry (as the dynamic methods)
    per_layer_type_rope = False

    long_factor: tuple[float, ...] | None = None
    short_factor: tuple[float, ...] | None = None
    attention_factor: float | None = None
    keep_first: int = 0
    factors_by: str = "sequence"

    @classmethod
    def only_hf_posext_computes(cls, record: dict[str, Any]) -> str | None:
        if record.get("factors_by") != "query":
            return None
        return (
            "past L_orig it applies the long factors to every position (transformers' longrope); factors_by='query' "
            "keeps the rows before L_orig on the short ones, which only hf-posext computes"
        )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.factors_by not in FACTORS_BY:
            raise ValueError(
                f"{self.name}: factors_by must be one of {', '.join(map(repr, FACTORS_BY))}, got {self.factors_by!r}"
            )
        if self.factors_by == "query" and not self.exact_cache:
            raise ValueError(
                f"{self.name}: factors_by='query' is computed by the exact cache; it needs exact_cache=True, "
                "got exact_cache=False (transformers' longrope is factors_by='sequence')"
            )
        object.__setattr__(
            self,
            "keep_first",
            whole_number(
                self.name,
                "keep_first",
                self.keep_first,
                minimum=0,
                allowed="an int >= 0 (positions kept on plain RoPE)",
            ),
        )
        for field in ("long_factor", "short_factor"):
            object.__setattr__(self, field, _factor_list(self.name, field, getattr(self, field)))
        if self.attention_factor is not None:
            value = real_number(self.name, "attention_factor", self.attention_factor, "> 0 or None")
            if not value > 0:
                raise ValueError(
                    f"{self.name}: attention_factor must be a positive number or None, got {self.attention_factor!r}"
                )
            object.__setattr__(self, "attention_factor", value)

    def check_base(self, base: BaseRope) -> None:
        if not self.keep_first:
            return
        if base.pair_divisors is not None:
            raise ValueError(
                f"{self.name}: keep_first keeps positions on plain RoPE, but this checkpoint ships "
                f"rope_type={base.rope_type!r}; pass override=True to apply LongRoPE on plain RoPE instead"
            )
        check_keep_first(self.name, self.keep_first, base.original_max_position_embeddings)

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        pairs = base.rotary_dim // 2
        original = base.original_max_position_embeddings
        long = (
            list(self.long_factor)
            if self.long_factor
            else yarn_long_factors(base.theta, base.rotary_dim, original, self.factor)
        )
        short = list(self.short_factor) if self.short_factor else [1.0] * pairs
        for field, values in (("long_factor", long), ("short_factor", short)):
            if len(values) != pairs:
                raise ValueError(
                    f"{self.name}: {field} has {len(values)} entries; this model has {pairs} rotary pairs "
                    f"(rotary dim {base.rotary_dim}), one factor each"
                )
        params = {
            **base.rope_parameters,
            "rope_type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "factor": self.factor,
            "original_max_position_embeddings": original,
        }
        # written out (transformers' default when not given): vLLM and Phi-3.5-MoE's config read
        # short_mscale / long_mscale, transformers attention_factor (hf_posext.rope_utils)
        attention = (
            self.attention_factor
            if self.attention_factor is not None
            else longrope_attention_factor(self.factor, original)
        )
        params["attention_factor"] = attention
        if self.keep_first:  # no reader but hf-posext runs it: no reader-only keys either
            params.update(rope_type=LONGROPE_KEEP_FIRST_ROPE_TYPE, **{KEEP_FIRST_KEY: self.keep_first})
        else:
            params.update(short_mscale=attention, long_mscale=attention)
        return params

    # On a checkpoint that ships a static scaling, LongRoPE without factors composes as YaRN's ramp on
    # its divisors (the search's starting point) with LongRoPE's temperature; factors are absolute.
    def pair_factors(self, base: BaseRope) -> torch.Tensor | None:
        if self.long_factor is not None or self.short_factor is not None:
            raise ValueError(
                f"{self.name}: long_factor and short_factor divide plain RoPE's frequencies; this checkpoint already "
                f"ships rope_type={base.rope_type!r}. Pass override=True to replace its scaling."
            )
        if base.pair_divisors is None:
            return None
        base_inv_freq = default_inv_freq(base.theta, base.rotary_dim).double() / base.pair_divisors
        return yarn_pair_factors(base_inv_freq, base.original_max_position_embeddings, self.factor)

    def temperature(self, base: BaseRope) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        return longrope_attention_factor(self.factor, base.original_max_position_embeddings)
