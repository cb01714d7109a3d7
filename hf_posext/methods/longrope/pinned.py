"""One LongRoPE factor set at every position of a forward and its backward (LongRoPE2's mixed-window training).

A LongRoPE model picks its factors from the forward's positions: short up to L_orig, long past it.
A training micro-batch knows which side it stands for (a PoSE sample spread over the target
context is a long sequence even where its largest position is within L_orig), so
`pinned_factors` makes every forward inside it use one set, wherever the rotation is
computed: the exact cache (``exact_cache=True``, the default), the keep-first rotary module, or
transformers' own rotary module (``exact_cache=False``). Shang et al. 2025, arXiv 2502.20082.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch.nn as nn

from ... import integration
from ...attention.exact_dynamic import ExactDynamicRotaryEmbedding
from ...rope_utils import LONGROPE_ROPE_TYPES
from .rope import LongRopeRotaryEmbedding

FACTOR_SETS = ("short", "long")


@contextlib.contextmanager
def pinned_factors(model: nn.Module, which: Literal["short", "long"]) -> Iterator[None]:
    """Within the block, every forward of ``model`` rotates all its positions with LongRoPE's ``which`` factors.

    ``"short"``: the short factors (as a sequence within the original context); ``"long"``: the long ones,
    with the first ``keep_first`` positions on plain RoPE (as a sequence past it). Keep the backward
    inside the block: activation checkpointing recomputes the forward there. The setting belongs to
    the model, not the thread: one model trained by two threads at once with different sets is not
    supported, and a copy of the model made within the block keeps the set.

    Args:
        model: a model patched with ``longrope`` (wrapped by PEFT, DDP... or not).
        which: ``"short"`` or ``"long"``.

    Raises:
        ValueError: ``which`` is neither, or ``model`` is not a LongRoPE model.
    """
    if which not in FACTOR_SETS:
        raise ValueError(f"which must be one of {', '.join(FACTOR_SETS)}; got {which!r}")
    rotaries = [module for _, module in integration.rotary_modules(model)]
    types = sorted({str(r.config.rope_parameters.get("rope_type")) for r in rotaries})
    if not rotaries or not set(types) <= set(LONGROPE_ROPE_TYPES):
        raise ValueError(f"pinned_factors needs a model patched with longrope; its rope types are {types or 'none'}")
    long = which == "long"
    with contextlib.ExitStack() as stack:
        for rope in {
            id(m.rope): m.rope for m in model.modules() if isinstance(m, ExactDynamicRotaryEmbedding)
        }.values():
            stack.callback(setattr, rope, "pinned", rope.pinned)
            rope.pinned = rope.saturation if long else rope.original
        for module in model.modules():
            if isinstance(module, LongRopeRotaryEmbedding):
                stack.callback(setattr, module, "pinned", module.pinned)
                module.pinned = long
        for rotary in rotaries:
            if rotary.rope_type == "longrope":  # transformers' own update picks the set per forward
                original = int(rotary.config.rope_parameters["original_max_position_embeddings"])
                init = integration.rope_init_function("longrope")
                device = integration.rotary_device(rotary)
                inv_freq, _ = init(rotary.config, device, seq_len=original + 1 if long else None)
                stack.enter_context(integration.longrope_frequencies_pinned(rotary, inv_freq))
        yield
