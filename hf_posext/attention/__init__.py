"""Attention implementations hf-posext registers with transformers: ALiBi (:mod:`.alibi`), remapping (:mod:`.remap`).

``import hf_posext`` calls :func:`register_attention`, after which ``config._attn_implementation =
ALIBI_ATTENTION`` (set by ``patch_model(model, "alibi")``) selects ALiBi in every supported model.
"""

from __future__ import annotations

from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

from .alibi import ALIBI_ATTENTION, BACKENDS, OLD_ALIBI_ATTENTION, alibi_attention_forward, alibi_mask, select_backend
from .remap import SAVED_ATTENTION, remap_attention
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
    # self_extend / dca checkpoints name it; the model is then built with the wrapper of a real kernel
    AttentionInterface.register(SAVED_ATTENTION, remap_attention)
    AttentionMaskInterface.register(SAVED_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


__all__ = ["ALIBI_ATTENTION", "BACKENDS", "alibi_slopes", "register_attention", "select_backend"]
