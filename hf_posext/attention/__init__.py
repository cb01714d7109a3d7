"""Attention implementations hf-posext registers with transformers: ALiBi (:mod:`.alibi`).

``import hf_posext`` calls :func:`register_attention`, after which ``config._attn_implementation =
ALIBI_ATTENTION`` (set by ``patch_model(model, "alibi")``) selects ALiBi in every supported model.
"""

from __future__ import annotations

from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

from .alibi import ALIBI_ATTENTION, BACKENDS, OLD_ALIBI_ATTENTION, alibi_attention_forward, alibi_mask, select_backend
from .slopes import alibi_slopes


def register_attention() -> None:
    """Register the ALiBi attention function and, with it, its mask function.

    transformers builds no causal mask at all for an attention name that has no mask function,
    so the two are always registered together. The old name is registered too, so that older
    checkpoints load (the model's adapter then switches to the current name).
    """
    for name in (ALIBI_ATTENTION, OLD_ALIBI_ATTENTION):
        AttentionInterface.register(name, alibi_attention_forward)
        AttentionMaskInterface.register(name, alibi_mask)


__all__ = ["ALIBI_ATTENTION", "BACKENDS", "alibi_slopes", "register_attention", "select_backend"]
