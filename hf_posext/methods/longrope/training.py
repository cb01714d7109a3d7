"""What fine-tuning a LongRoPE model needs: which factor set each micro-batch trains (``--set factors=...``).

A LongRoPE model picks its factors from a forward's positions, but a training micro-batch stands
for a sequence it may not hold whole (a PoSE sample spread over the target context, a short
document of the long/short mix): `LongRopeTraining` pins each micro-batch's forward and
backward to the set inference uses at the length it stands for (``mixed``, LongRoPE2's mixed
context window training, Shang et al. 2025, arXiv 2502.20082), or to the long set throughout
(``long``, LongRoPE's own fine-tune). docs/methods/longrope.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Mapping
from typing import Any

import torch.nn as nn

from ..training import Training, TrainingOption
from .pinned import pinned_factors

FACTORS = TrainingOption(
    "factors",
    choices=("mixed", "long"),
    default="mixed",
    help="which of LongRoPE's factor sets each micro-batch trains. mixed (LongRoPE2): a micro-batch standing for a "
    "sequence within the original context (the short side of the mix, a window no longer than it) trains the short "
    "factors, every other (PoSE samples included) the long factors at every position, so both sides of the switch "
    "are trained; long: every micro-batch the long factors (LongRoPE's own fine-tune; short prompts then run on "
    "short factors the fine-tune never saw)",
    old_setting="longrope_factors",
)


class LongRopeTraining(Training):
    """LongRoPE's factor set pinned per micro-batch (`pinned_factors`), chosen by the ``factors`` option."""

    options = (FACTORS,)

    def check_lengths(self, options: Mapping[str, str], *, original_context: int, short_len: int | None) -> None:
        if options["factors"] == "mixed" and short_len is not None and short_len > original_context:
            raise ValueError(
                f"factors='mixed' (--set) trains the short micro-batches with the short factors, which hold up to "
                f"the original context of {original_context} tokens; short_seq_len={short_len} would train longer "
                f"documents on them: use short_seq_len <= {original_context}"
            )

    def pin_for(self, options: Mapping[str, str], *, length: int, original_context: int) -> Hashable | None:
        """``mixed``: the set inference uses at ``length``, short up to the original context, long past it;
        ``long``: always the long set."""
        return "long" if options["factors"] == "long" or length > original_context else "short"

    def pinned(self, model: nn.Module, pin: Hashable) -> contextlib.AbstractContextManager[Any]:
        return pinned_factors(model, pin)  # type: ignore[arg-type]  # pin_for's "short" or "long"

    def describe(self, options: Mapping[str, str]) -> dict[str, str]:
        trained = (
            "mixed: short factors on sequences within the original context, long ones past it (LongRoPE2)"
            if options["factors"] == "mixed"
            else "long factors on every sequence"
        )
        return {"LongRoPE factors trained": trained}
