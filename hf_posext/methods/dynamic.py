"""What every dynamic method shares: the ``exact_cache`` option (its surgery: :mod:`hf_posext.adapters.dynamic`).

Dynamic methods (YaRN paper, arXiv 2309.00071, section 3.3) recompute the rotary frequencies
from the current sequence length. With ``exact_cache=True`` (the default)
:mod:`hf_posext.exact_dynamic` keeps KV-cached decoding equal to a forward pass at every step;
``False`` keeps transformers' behaviour, whose cache holds keys rotated with stale frequencies
(transformers issue 25104), with one fix: when transformers resets the frequencies for a sequence
shorter than the original context, YaRN's attention scaling is reset with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import PositionMethod


@dataclass(frozen=True)
class DynamicScaling(PositionMethod):
    """Base of the dynamic methods.

    Args:
        exact_cache: keep KV-cached decoding equal to a forward pass at every step
            (:mod:`hf_posext.exact_dynamic`); ``False`` rotates each key once before caching, as
            transformers does for its dynamic types and the YaRN repository for dynamic YaRN.
    """

    dynamic = True

    exact_cache: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.exact_cache, bool):
            raise ValueError(f"{self.name}: exact_cache must be True or False, got {self.exact_cache!r}")
