"""Exact dynamic attention for query rows that each need their own frequencies (a prompt past L_orig).

Every row between L_orig and saturation has its own length, so its own rotation of the keys.
`attend_rowwise` writes the eager kernel's arithmetic out so that a chunk of rows is one
batched computation (in fp32 `complex_rowwise.attend_complex`, in its own module);
`attend_rowwise_by_kernel` sends the same rows to the kernel as a batch of single-query
problems and is the reference the first is tested against.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..inputs import AttentionInputs
from .complex_rowwise import attend_complex, contiguous_keys, rows_mask
from .forward_plan import ACCELERATOR_ROWWISE_BUDGET, ROWWISE_BUDGET, ForwardPlan, RowWise
from .rotation import apply_rotary, grid_rotations, rotate, uses_complex_rotation


def _query_tables(
    plan: ForwardPlan, query: torch.Tensor, positions: torch.Tensor, rowwise: RowWise, start: int, stop: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[batch, rows, rotary_dim // 2]`` of rows ``[start, stop)``'s queries, each with its own frequencies."""
    inv_freq, scaling = rowwise.inv_freq[:, start:stop], rowwise.scaling[:, start:stop]

    def build():
        freqs = positions[:, start:stop, None].float() * inv_freq  # [batch, rows, rotary_dim // 2]
        scale = scaling[..., None]
        return (freqs.cos() * scale).to(query.dtype), (freqs.sin() * scale).to(query.dtype)

    return plan.tables(("q-row", start, stop), build)


def _key_tables(
    plan: ForwardPlan,
    query: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: RowWise,
    start: int,
    stop: int,
    keys: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[batch, rows, keys, rotary_dim // 2]`` in the query dtype: `_key_rotation_table`, real."""

    def build():
        rotations = _key_rotation_table(plan, key_positions, rowwise, start, stop, keys)
        return rotations.real.to(query.dtype), rotations.imag.to(query.dtype)

    return plan.tables(("k-row", start, stop, key_positions.shape[1], query.dtype), build)


def _key_rotation_table(
    plan: ForwardPlan, key_positions: torch.Tensor, rowwise: RowWise, start: int, stop: int, keys: int
) -> torch.Tensor:
    """Every row's rotation of the first ``keys`` keys as unit complex numbers times its multiplier.

    ``[batch, rows, keys, rotary_dim // 2]`` complex64 for query rows ``[start, stop)``. When every
    batch row's key positions run contiguously (no left padding, no gaps) it comes from
    `grid_rotations`; otherwise each angle is computed directly.
    """
    inv_freq, scaling = rowwise.inv_freq[:, start:stop], rowwise.scaling[:, start:stop]
    if contiguous_keys(plan, key_positions):
        return grid_rotations(key_positions[:, keys - 1], keys, inv_freq, scaling)
    freqs = key_positions[:, None, :keys, None].float() * inv_freq[:, :, None, :]  # [batch, rows, keys, half]
    table = freqs.new_empty(*freqs.shape, 2)
    torch.cos(freqs, out=table[..., 0])
    torch.sin(freqs, out=table[..., 1])
    return torch.view_as_complex(table.mul_(scaling[..., None, None, None]))


#: Kernel arguments the batched row-wise path does not implement (attention sinks, logit
#: soft-capping); with any of them set, or dropout, the rows go through the kernel instead.
KERNEL_ONLY = ("s_aux", "softcap")


def _row_chunks(rowwise: RowWise, key: torch.Tensor) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` row ranges whose per-row key copies stay within ``ROWWISE_BUDGET`` elements
    (``ACCELERATOR_ROWWISE_BUDGET`` off the CPU)."""
    budget = ROWWISE_BUDGET if key.device.type == "cpu" else ACCELERATOR_ROWWISE_BUDGET
    chunk = max(1, budget // max(1, key.numel()))
    for start in range(rowwise.start, rowwise.stop, chunk):
        yield start, min(start + chunk, rowwise.stop)


def attend_rowwise(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, key_positions: torch.Tensor, rowwise: RowWise, merge: Any
) -> None:
    """Attend rows that each need their own frequencies: a chunk of rows per batched matmul.

    The eager kernel's arithmetic (scores in the query dtype, mask added, softmax in fp32, cast
    back, times values), written out so that a chunk of rows is one computation: each row's keys
    are rotated with its frequencies (``[batch, rows, kv_heads, keys, head_dim]``), the grouped
    queries of a KV head multiply them in one batched matmul, and the probabilities of all rows
    share the un-copied values. fp32 takes `complex_rowwise.attend_complex`; other dtypes (no complex type
    rounds like them) rotate with `rotate`. Equal to `attend_rowwise_by_kernel` up to fp32 rounding;
    it does not call the kernel, whose batch-of-single-queries layout copies the keys again for
    every query head (eager's ``repeat_kv``) and the values for every row.
    """
    query, key, value, attention_mask = inputs.query, inputs.key, inputs.value, inputs.attention_mask
    positions = plan.positions
    scaling = inputs.kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if uses_complex_rotation(query, key, value):
        chunks = list(_row_chunks(rowwise, key))
        attend_complex(plan, inputs, key_positions, rowwise, merge, scaling, chunks)
        return
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups, past = heads // kv_heads, kv_len - seq
    for start, stop in _row_chunks(rowwise, key):
        rows, keys = stop - start, past + stop
        q = apply_rotary(query[:, :, start:stop], *_query_tables(plan, query, positions, rowwise, start, stop))
        q = q.view(batch, kv_heads, groups, rows, dim).permute(0, 3, 1, 2, 4)  # [batch, rows, kv_heads, groups, dim]
        # each row's own rotation of the keys, then one batched matmul with its queries
        k_cos, k_sin = _key_tables(plan, query, key_positions, rowwise, start, stop, keys)
        k = rotate(key[:, None, :, :keys], k_cos[:, :, None], k_sin[:, :, None])  # [batch, rows, kv_heads, keys, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * scaling  # [batch, rows, kv_heads, groups, keys]
        mask = rows_mask(attention_mask, start, stop, keys, past, query.dtype, query.device)
        # [batch or 1, rows, 1 or kv_heads, 1 or groups, keys]: one mask for all heads, or one per head (Doge)
        mask = mask.unflatten(1, (kv_heads, -1) if mask.shape[1] > 1 else (1, 1)).permute(0, 3, 1, 2, 4)
        # sdpa's boolean masks: True attends
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
        probs = probs.permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, rows * groups, keys)
        out = torch.matmul(probs, value[:, :, :keys])  # [batch, kv_heads, rows * groups, dim]
        out = out.view(batch, kv_heads, rows, groups, -1).permute(0, 2, 1, 3, 4).reshape(batch, rows, heads, -1)
        part = None
        if plan.rope.kernel == "eager":  # eager returns its weights: [batch, heads, rows, keys]
            part = probs.view(batch, kv_heads, rows, groups, keys).transpose(2, 3).reshape(batch, heads, rows, keys)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)


def attend_rowwise_by_kernel(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, key_positions: torch.Tensor, rowwise: RowWise, merge: Any
) -> None:
    """Attend rows that each need their own frequencies, a chunk of rows per kernel call.

    Each (batch, row) of a chunk becomes one single-query item of a ``batch * chunk`` kernel
    call, with its own copy of the keys rotated by its frequencies. The reference for
    `attend_rowwise`, and the path for what that does not implement (dropout, sinks,
    soft-capping).
    """
    query, key, value, attention_mask = inputs.query, inputs.key, inputs.value, inputs.attention_mask
    positions = plan.positions
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    past = kv_len - seq
    for start, stop in _row_chunks(rowwise, key):
        rows, keys = stop - start, past + stop
        q = apply_rotary(query[:, :, start:stop], *_query_tables(plan, query, positions, rowwise, start, stop))
        k_cos, k_sin = _key_tables(plan, query, key_positions, rowwise, start, stop, keys)
        q = q.transpose(1, 2).reshape(batch * rows, heads, 1, dim)
        # every row's own rotation of the keys: [batch, rows, kv_heads, keys, dim]
        k = rotate(key[:, None, :, :keys], k_cos[:, :, None], k_sin[:, :, None]).reshape(
            batch * rows, kv_heads, keys, dim
        )
        v = value[:, None, :, :keys].expand(batch, rows, kv_heads, keys, value.shape[-1])
        v = v.reshape(batch * rows, kv_heads, keys, value.shape[-1])
        mask = rows_mask(attention_mask, start, stop, keys, past, query.dtype, query.device)
        mask = mask.expand(batch, -1, -1, -1).transpose(1, 2).reshape(batch * rows, mask.shape[1], 1, keys)
        out, part = kernel(inputs.module, q, k, v, mask, **inputs.kwargs)
        out = out.reshape(batch, rows, heads, out.shape[-1])
        if part is not None:
            part = part.reshape(batch, rows, part.shape[1], keys).transpose(1, 2)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)
