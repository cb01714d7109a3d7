"""Attention heads split over processes: which heads this process holds under sequence parallelism.

DeepSpeed Ulysses exchanges ``[batch, heads, seq / n, dim]`` on each of n processes for
``[batch, heads / n, seq, dim]`` before attention: process r of the group holds heads
r * H/n .. (r + 1) * H/n - 1 of the whole sequence. Attention that differs by head (ALiBi's slopes)
must know which: `shard_heads` records it on the attention modules, `held_heads` reads it.
"""

from __future__ import annotations

from torch import nn

from ..architectures import attention_modules

#: Where an attention module keeps ``(rank, size)`` of its sequence-parallel group.
SHARD_ATTR = "hf_posext_head_shard"


def shard_heads(model: nn.Module, rank: int, size: int) -> None:
    """Record on every attention module of ``model`` that this process is ``rank`` of ``size`` head shards."""
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in 0..{size - 1} (size={size}), got {rank}")
    for module in attention_modules(model):
        module.__dict__[SHARD_ATTR] = (rank, size)


def held_heads(module: nn.Module, local_heads: int) -> tuple[int, int]:
    """``(first, total)``: the first of the ``local_heads`` query heads this process holds, of ``total``.

    Raises:
        ValueError: heads split without `shard_heads`, or another split than recorded.
    """
    config = getattr(module, "config", None)
    total = int(getattr(config, "num_attention_heads", None) or getattr(module, "num_heads", local_heads))
    if local_heads == total:
        return 0, total
    shard = module.__dict__.get(SHARD_ATTR)
    if shard is None or shard[1] * local_heads != total:
        raise ValueError(
            f"{type(module).__name__} attends over {local_heads} of its {total} heads (heads split over processes, "
            f"as DeepSpeed Ulysses does) but the split recorded is {shard} (rank, size): call hf_posext.attention."
            "head_sharding.shard_heads(model, sp_rank, sp_size) first (the recipe does for sp_size > 1)"
        )
    return shard[0] * local_heads, total
