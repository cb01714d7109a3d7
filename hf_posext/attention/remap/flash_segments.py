"""Remapped attention's fused path: one flash-kernel call per piece, the pieces merged exactly by log-sum-exp.

PyTorch's CPU flash kernel returns a call's log-sum-exp beside its output, so the pieces of a
`layout.Layout` (each with its own (query, key) variant over its own key columns) make one
exact softmax without any score matrix in memory, at about the FLOPs of one causal attention
(LongLM's and ChunkLlama's flash paths merge the same way). `attention` takes this path where
`flash_available` says so (CPU inference without a padding mask, dropout or softcap) and its
score path everywhere else; tests/attention/remap/test_flash_segments.py checks the two against each other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..inputs import AttentionInputs
from .layout import Layout, Piece

#: Query rows per block (a per-pair piece's masks are ``[groups * block, columns]``).
FLASH_BLOCK = 256

_KERNEL = "_scaled_dot_product_flash_attention_for_cpu"


def flash_with_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its log-sum-exp by PyTorch's fused CPU flash kernel.

    ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` is a private op: the kernel
    ``F.scaled_dot_product_attention`` runs on CPU, the only one there that returns the log-sum-exp
    (the public function drops it). Its contract as read in torch 2.13: key/value heads may divide the
    query heads (GQA, no repeat needed); ``causal`` is top-left aligned; a float ``mask`` (the query's
    dtype) is added to the scores; a row whose keys are all masked gets output 0 and lse 0, not -inf.

    Args:
        query: ``[batch, heads, rows, dim]``; key, value: ``[batch, kv_heads, keys, dim]``.
        scale: the score scale.
        causal: mask keys after each row (row ``i`` sees keys ``<= i``).
        mask: an additive float mask broadcasting to ``[batch, heads, rows, keys]``.

    Returns:
        ``(output [batch, heads, rows, dim], lse [batch, heads, rows] float32)``.
    """
    kernel = getattr(torch.ops.aten, _KERNEL)
    return kernel(query, key, value, 0.0, causal, attn_mask=mask, scale=scale)


def _records(query: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and query.requires_grad


def flash_available(module: nn.Module, kwargs: dict[str, Any], query: torch.Tensor) -> bool:
    """Whether the fused path runs: a CPU tensor, no dropout or softcap, no autograd, a torch with the kernel.

    The kernel's backward ignores the gradient of its log-sum-exp, which the merge of the pieces
    needs (training through it gave gradients tens of percent off): training takes the score path.
    A torch without the kernel (it is private) takes the score path too. The caller checks that
    there is no mask beyond causal.
    """
    return (
        query.device.type == "cpu"
        and kwargs.get("softcap") is None
        and not _records(query)
        and not (module.training and kwargs.get("dropout"))
        and hasattr(torch.ops.aten, _KERNEL)
    )


def flash_segmented_attention(inputs: AttentionInputs, layout: Layout, offset: int, scale: float) -> torch.Tensor:
    """`attention.segmented_attention` without a mask beyond causal, by `flash_with_lse` per piece.

    Args:
        inputs: the call for these rows (its mask unused): values ``[rows, kv_heads, kv_len, head_dim]``; the
            queries' and keys' shapes give the heads, new tokens and cached keys (the layout holds what is scored).
        layout: the method's pieces.
        offset: the rows' position offset.
        scale: the score scale.

    Returns:
        ``[rows, seq, heads, head_dim]`` in ``value``'s dtype (each block merged in fp32, then rounded once).
    """
    value, (_, heads, seq, _) = inputs.value, inputs.query.shape
    rows, kv_heads, kv_len, dim = value.shape
    past = kv_len - seq
    groups = heads // kv_heads
    value32 = value.to(torch.float32)
    output = value.new_empty(rows, seq, heads, dim)
    for start, stop in layout.blocks(past, seq, offset, FLASH_BLOCK):
        block = stop - start
        outs: list[torch.Tensor] = []
        lses: list[torch.Tensor] = []
        for piece in layout.pieces(start, stop):
            v = value32[:, :, piece.start : piece.stop]
            if piece.causal:
                out, lse = flash_with_lse(
                    piece.query.reshape(rows, heads, block, dim), piece.key, v, scale, causal=True
                )
                outs.append(out)
                lses.append(lse)
                continue
            for (query, key), allowed in _variants(piece, past + start, block):
                if allowed is None:
                    out, lse = flash_with_lse(query, key, v, scale)
                else:
                    seen = allowed.any(dim=-1)
                    if not bool(seen.any()):
                        continue
                    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=v.device)
                    bias = bias.masked_fill_(~allowed, float("-inf")).repeat(groups, 1)
                    out, lse = flash_with_lse(query, key, v, scale, mask=bias)
                    empty = ~seen.repeat(groups)  # the kernel gives a row without keys lse 0: make it -inf
                    lse = lse.masked_fill(empty, float("-inf"))
                    out = out.masked_fill(empty[:, None], 0.0)
                outs.append(out.reshape(rows, heads, block, dim))
                lses.append(lse.reshape(rows, heads, block))
        output[:, start:stop] = _merge(outs, lses).transpose(1, 2)
    return output


def _variants(
    piece: Piece, first_row: int, block: int
) -> list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]]:
    """The (query, key) variants of a piece that is not ``causal``, each with the pairs it scores.

    A pair mask is ``[block, stop - start]`` bool; ``None`` where the variant scores every pair (a
    plain piece before the block's first row). No row scores a key past its own position.
    """
    if piece.other is None and piece.stop <= first_row + 1:
        return [((piece.query, piece.key), None)]
    device = piece.key.device
    visible = (
        torch.arange(piece.start, piece.stop, device=device)[None, :]
        <= torch.arange(first_row, first_row + block, device=device)[:, None]
    )
    own = (piece.query, piece.key)
    first, second = piece.first, piece.second
    if piece.other is None or first is None:
        return [(own, visible)]
    if piece.third is None or second is None:
        return [(own, first & visible), (piece.other, ~first & visible)]
    return [(own, first & visible), (piece.other, ~first & second & visible), (piece.third, ~first & ~second & visible)]


def _merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """One softmax over the union of the pieces: each piece's output weighted by its share of the total mass."""
    if len(outs) == 1:
        return outs[0]
    lse = torch.stack(lses)
    top = lse.amax(dim=0)  # finite: every row sees its own key in some piece
    weights = lse.sub_(top).exp_()
    weights = weights.div_(weights.sum(dim=0))[..., None]
    merged = outs[0] * weights[0]
    for out, weight in zip(outs[1:], weights[1:]):
        merged.addcmul_(out, weight)
    return merged
