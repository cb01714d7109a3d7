"""ALiBi folded into SDPA's causal kernel as extra query/key channels: no L x L tensor, trains on CPU.

The per-head bias factorises over (query, key), so it becomes five extra channels of q and k, run
by ``scaled_dot_product_attention(..., is_causal=True)``; the slope is split in two so the fp32
logits stay within `logit_error_bound` of the exact ones. Only masks ``is_causal`` can
express come here (`query_shift`); the rest run the exact ``sdpa`` path. The derivation and
the error bound: docs/methods/alibi.md ("The folded backend").
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from ... import integration as masking_utils  # transformers' mask builders, re-exported

from ...attention.head_sharding import held_heads
from .slopes import alibi_slopes

#: Extra channels: two position pairs (the high and the low part of the slope) and the padding one.
EXTRA_CHANNELS = 5
#: A padding key's logit: finite, so that a query with no real key (left padding) gets uniform
#: weights instead of NaN (which the next layer's values would spread), and far below any real
#: logit, so that exp() of it is exactly 0 next to one.
PADDING_LOGIT = -1e30
#: fp32's significand bits: products of integers below 2^24 are exact.
FP32_BITS = 24


def query_shift(q_length: int, kv_length: int) -> int:
    """Position of the first query counted from the first key, where the mask is ``is_causal``."""
    return kv_length - 1 if q_length == 1 else 0


def folded_mask(common: dict[str, Any], options: dict[str, Any], allow_is_causal_skip: bool) -> tuple[bool, Any]:
    """Whether the folded path runs this mask, and the mask it gets: None or "key is real".

    Args:
        common: ``sdpa_mask``'s shape, offset, pattern, padding and device arguments.
        options: its ``local_size``, ``allow_is_bidirectional_skip`` and ``use_vmap``.
        allow_is_causal_skip: transformers' switch (off for packed sequences, or/and masks and
            compiled decoding).

    Returns:
        ``(True, None)``, ``(True, [batch, 1, 1, kv] bool)``, or ``(False, None)`` for the exact path.
    """
    # transformers' own SDPA rule: sdpa_mask returns None where SDPA may use is_causal. A custom
    # pattern qualifies only with the window size the rule reads. Padding is set aside for a block
    # of queries (the padding channel masks it); one query with padding keeps the exact path,
    # whose mask is [batch, 1, 1, kv] anyway.
    q_length, kv_length = common["q_length"], common["kv_length"]
    attention_mask = common["attention_mask"]
    custom = common["mask_function"] is not masking_utils.causal_mask_function
    if not allow_is_causal_skip or (custom and options["local_size"] is None):
        return False, None
    without_padding = {**common, "attention_mask": attention_mask if q_length == 1 else None}
    if masking_utils.sdpa_mask(**without_padding, **options, allow_is_causal_skip=True) is not None:
        return False, None
    if int(common["q_offset"]) - int(common["kv_offset"]) != query_shift(q_length, kv_length):
        return False, None
    padding = masking_utils.prepare_padding_mask(attention_mask, kv_length, common["kv_offset"])
    return True, None if padding is None or q_length == 1 else padding[:, None, None, :]


def is_key_padding(mask: Any, query: torch.Tensor) -> bool:
    """Whether ``mask`` is `folded_mask`'s ``[batch, 1, 1, kv]`` "key is real" form.

    The exact path's masks for a block of queries are ``[batch, 1, q, kv]`` and fp32; the folded
    form is only made for q > 1.
    """
    return (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[-2] == 1
        and query.shape[2] > 1
    )


def position_bits(kv_length: int) -> int:
    """Significant bits of the slopes' high part that keep m_hi * position exact in fp32.

    Raises:
        ValueError: for more than 2^23 keys (no bits left).
    """
    bits = FP32_BITS - max(kv_length - 1, 1).bit_length()
    if bits < 1:
        raise ValueError(f"ALiBi backend 'folded' supports up to {2 ** (FP32_BITS - 1)} keys, got {kv_length}")
    return bits


@functools.lru_cache(maxsize=64)
def split_slopes(num_heads: int, bits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m_hi, m_lo)``, each ``[heads]`` fp32, with m_hi + m_lo == m exactly and m_hi of ``bits`` bits."""
    slopes = alibi_slopes(num_heads, device=device)
    mantissa, exponent = torch.frexp(slopes)
    high = torch.ldexp(torch.round(torch.ldexp(mantissa, torch.tensor(bits))), exponent - bits)
    return high, slopes - high


def logit_error_bound(num_heads: int, kv_length: int) -> float:
    """Largest absolute logit error the folding adds (beyond the exact paths' own rounding)."""
    _, low = split_slopes(num_heads, position_bits(kv_length), torch.device("cpu"))
    return 3 * 2.0**-FP32_BITS * float(low.abs().max()) * kv_length


def folded_operands(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_shift: int,
    scaling: float,
    key_is_real: torch.Tensor | None = None,
    heads: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q', k', v')`` in fp32, head dim ``head_dim + 5`` rounded up to a multiple of 8.

    Args:
        query: ``[batch, heads, q, head_dim]``; key, value: ``[batch, kv_heads, kv, head_dim]``.
        query_shift: position of the first query counted from the first key.
        scaling: the logit scale s, folded into q'.
        key_is_real: ``[batch, kv]`` boolean, False for padding keys; None when there is none.
        heads: ``(first, total)``: the query heads are ``first ..`` of ``total`` (heads split over
            processes, `hf_posext.attention.head_sharding`); None: all of them.
    """
    batch, local, q_length, head_dim = query.shape
    first, total = heads if heads is not None else (0, local)
    kv_heads, kv_length = key.shape[1], key.shape[2]
    padded = -(-(head_dim + EXTRA_CHANNELS) // 8) * 8
    zeros = padded - head_dim - EXTRA_CHANNELS
    device = query.device
    high, low = split_slopes(total, position_bits(max(kv_length, query_shift + q_length)), device)
    q_pos = (torch.arange(q_length, device=device) + query_shift).to(torch.float32).view(1, 1, q_length, 1)
    high, low = high[first : first + local].view(1, local, 1, 1), low[first : first + local].view(1, local, 1, 1)
    ones = torch.ones(1, local, q_length, 1, device=device)
    q_extra = torch.cat([high * ones, -high * q_pos, low * ones, -low * q_pos, ones], -1)
    k_pos = torch.arange(kv_length, device=device, dtype=torch.float32).view(1, 1, kv_length, 1)
    k_extra = torch.cat([k_pos, torch.ones_like(k_pos)], -1).repeat(1, 1, 1, 2).expand(batch, kv_heads, -1, -1)
    if key_is_real is None:
        k_padding = k_pos.new_zeros(batch, kv_heads, kv_length, 1)
    else:
        k_padding = torch.where(key_is_real, 0.0, PADDING_LOGIT).to(device, torch.float32)
        k_padding = k_padding.view(batch, 1, kv_length, 1).expand(batch, kv_heads, kv_length, 1)
    q_parts = [q_extra.expand(batch, -1, -1, -1), query.to(torch.float32) * scaling]
    k_parts = [k_extra, k_padding, key.to(torch.float32)]
    if zeros:
        q_parts.append(query.new_zeros(batch, local, q_length, zeros, dtype=torch.float32))
        k_parts.append(key.new_zeros(batch, kv_heads, kv_length, zeros, dtype=torch.float32))
    v_folded = F.pad(value.to(torch.float32), (0, padded - head_dim))
    return torch.cat(q_parts, -1), torch.cat(k_parts, -1), v_folded


def folded_alibi(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
    key_is_real: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """ALiBi attention through SDPA's causal kernel (see the module docstring).

    Args:
        query: ``[batch, heads, q, head_dim]``; key, value: ``[batch, kv_heads, kv, head_dim]``.
        key_is_real: ``[batch, kv]`` boolean, False for padding keys; None when there is none.

    Returns:
        ``([batch, q, heads, head_dim], None)`` in the query's dtype.
    """
    shift = query_shift(query.shape[2], key.shape[2])
    heads = held_heads(module, query.shape[1])
    q, k, v = folded_operands(query, key, value, shift, scaling, key_is_real, heads)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        dropout_p=dropout if module.training else 0.0,
        # one query attends to every cached key; a longer block starts at the first key (full
        # prefill or an empty static cache), where top-left alignment is the causal mask
        is_causal=query.shape[2] > 1,
        scale=1.0,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out[..., : query.shape[-1]].to(query.dtype).transpose(1, 2).contiguous(), None
