"""Exact dynamic attention for query rows that each need their own frequencies (a prompt past L_orig).

Every row between L_orig and saturation has its own length, so its own rotation of the keys.
:func:`attend_rowwise` writes the eager kernel's arithmetic out so that a chunk of rows is one
batched computation; :func:`attend_rowwise_by_kernel` sends the same rows to the kernel as a batch
of single-query problems and is the reference the first is tested against.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from .plan import ROWWISE_BUDGET, ForwardPlan, RowWise
from .rotation import apply_rotary, grid_factors, grid_product, grid_rotations, grid_size, rotate, uses_complex_rotation


def rows_mask(
    attention_mask: torch.Tensor | None,
    start: int,
    stop: int,
    keys: int,
    past: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The mask of query rows ``[start, stop)`` against the first ``keys`` keys.

    ``None`` (sdpa's "plain causal, use is_causal") becomes an explicit additive causal mask:
    sdpa's ``is_causal`` aligns top-left, which is wrong for a slice of rows.
    """
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
            raise ValueError(f"exact dynamic attention needs a 4D mask tensor or None, got {type(attention_mask)}")
        return attention_mask[:, :, start:stop, :keys]
    rows = torch.arange(start, stop, device=device)[:, None] + past
    allowed = torch.arange(keys, device=device)[None, :] <= rows
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


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
    """cos/sin ``[batch, rows, keys, rotary_dim // 2]`` in the query dtype: :func:`_key_rotation_table`, real."""

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
    :func:`grid_rotations`; otherwise each angle is computed directly.
    """
    inv_freq, scaling = rowwise.inv_freq[:, start:stop], rowwise.scaling[:, start:stop]
    if _contiguous(plan, key_positions):
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
    """``(start, stop)`` row ranges whose per-row key copies stay within ``ROWWISE_BUDGET`` elements."""
    chunk = max(1, ROWWISE_BUDGET // max(1, key.numel()))
    for start in range(rowwise.start, rowwise.stop, chunk):
        yield start, min(start + chunk, rowwise.stop)


def attend_rowwise(
    plan: ForwardPlan,
    kernel: Any,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: RowWise,
    merge: Any,
    kwargs: dict[str, Any],
) -> None:
    """Attend rows that each need their own frequencies: a chunk of rows per batched matmul.

    The eager kernel's arithmetic (scores in the query dtype, mask added, softmax in fp32, cast
    back, times values), written out so that a chunk of rows is one computation: each row's keys
    are rotated with its frequencies (``[batch, rows, kv_heads, keys, head_dim]``), the grouped
    queries of a KV head multiply them in one batched matmul, and the probabilities of all rows
    share the un-copied values. fp32 takes :func:`_attend_complex`; other dtypes (no complex type
    rounds like them) rotate with :func:`rotate`. Equal to :func:`attend_rowwise_by_kernel` up to fp32 rounding;
    it does not call the kernel, whose batch-of-single-queries layout copies the keys again for
    every query head (eager's ``repeat_kv``) and the values for every row.
    """
    scaling = kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if uses_complex_rotation(query):
        _attend_complex(plan, query, key, value, attention_mask, positions, key_positions, rowwise, merge, scaling)
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
        if mask.dtype == torch.bool:  # sdpa's boolean masks: True attends
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
        probs = probs.permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, rows * groups, keys)
        out = torch.matmul(probs, value[:, :, :keys])  # [batch, kv_heads, rows * groups, dim]
        out = out.view(batch, kv_heads, rows, groups, -1).permute(0, 2, 1, 3, 4).reshape(batch, rows, heads, -1)
        part = None
        if plan.rope.kernel == "eager":  # eager returns its weights: [batch, heads, rows, keys]
            part = probs.view(batch, kv_heads, rows, groups, keys).transpose(2, 3).reshape(batch, heads, rows, keys)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)


def _kept_pairs(rowwise: RowWise) -> int:
    """How many leading channel pairs have the same frequency in every row: YaRN's high-frequency
    pairs, which it never interpolates, and dynamic NTK's first (theta^0 = 1 at any base)."""
    same = (rowwise.inv_freq == rowwise.inv_freq[:1, :1]).flatten(0, 1).all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def _attend_complex(
    plan: ForwardPlan,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: RowWise,
    merge: Any,
    scaling: float,
) -> None:
    """:func:`attend_rowwise` in fp32: each channel pair (i, i + rotary_dim / 2) is one complex number.

    A row's rotation of its keys is then one complex multiply per pair (``_rotate`` makes seven
    passes and a concatenation); its real view interleaves the pairs, and the queries are
    interleaved alike, which leaves the dot products unchanged. Each row's multiplier (YaRN's
    mscale, squared: it scales both sides) and its query rotation go on the queries, so that the
    keys turn by unit rotations. Only the pairs whose frequency differs between rows are
    rotated per row: the leading pairs with one frequency for all rows (:func:`_kept_pairs`) are
    rotated once per key and, with the channels past ``rotary_dim``, add one matmul over all rows
    of a chunk. The per-row keys, tables and scores of a chunk go to the forward's scratch memory
    (:meth:`ForwardPlan.scratch`), laid out ``[batch, kv_heads, rows, ...]`` so that the scores
    of a KV head's rows and groups are one ``[rows * groups, keys]`` matrix for the values.
    """
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups, past = heads // kv_heads, kv_len - seq
    half = plan.rope.rotary_dim // 2
    kept = plan.memo(("kept pairs",), lambda: _kept_pairs(rowwise))
    turned = half - kept
    chunks = list(_row_chunks(rowwise, key))
    most = max(stop - start for start, stop in chunks)
    contiguous = _contiguous(plan, key_positions)
    # the keys' turned pairs as complex numbers, and the un-turned channels, rotated once for every row
    pairs = plan.scratch("pairs", batch * kv_heads * kv_len * turned, torch.complex64)
    pairs = pairs.view(batch, kv_heads, kv_len, turned)
    torch.complex(key[..., kept:half], key[..., half + kept : 2 * half], out=pairs)
    shared = _shared_keys(plan, key, key_positions, rowwise, kept)  # [batch, kv_heads, kv_len, 2 kept + rest] or None
    table_size = batch * most * (grid_size(kv_len) if contiguous else kv_len) * turned
    table_buffer = plan.scratch("table", table_size, torch.complex64)
    rotated_buffer = plan.scratch("rotated", batch * kv_heads * most * kv_len * turned, torch.complex64)
    scores_buffer = plan.scratch("scores", batch * heads * most * kv_len, torch.float32)
    probs_buffer = plan.scratch("probs", batch * heads * most * kv_len, torch.float32)
    queries, rest_queries = _rotated_queries(plan, query, kv_heads, positions, rowwise, kept, scaling)
    for start, stop in chunks:
        rows, keys = stop - start, past + stop
        inv_freq = rowwise.inv_freq[:, start:stop, kept:]
        if contiguous:  # the grid's two short tables are the same in every layer
            factors = plan.tables(  # keyed by the rows: layers with other KV shapes chunk otherwise
                ("k-grid", start, stop, keys), lambda: grid_factors(key_positions[:, keys - 1], keys, inv_freq, None)
            )
            table = grid_product(factors, keys, out=table_buffer)
        else:
            angles = key_positions[:, None, :keys, None].float() * inv_freq[:, :, None, :]
            table = torch.complex(angles.cos(), angles.sin())  # [batch, rows, keys, turned]
        rotated = rotated_buffer[: batch * kv_heads * rows * keys * turned].view(batch, kv_heads, rows, keys, turned)
        torch.mul(pairs[:, :, None, :keys], table[:, None], out=rotated)
        first, last = start - rowwise.start, stop - rowwise.start
        scores = scores_buffer[: batch * heads * rows * keys].view(batch, kv_heads, rows, groups, keys)
        rotated = torch.view_as_real(rotated).flatten(-2).transpose(-1, -2)
        torch.matmul(queries[:, :, first:last], rotated, out=scores)
        if shared is not None:
            rest = rest_queries[:, :, first:last].flatten(2, 3).flatten(0, 1)  # [batch * kv_heads, rows * groups, c]
            scores.view(batch * kv_heads, rows * groups, keys).baddbmm_(
                rest, shared[:, :, :keys].flatten(0, 1).transpose(-1, -2)
            )
        mask = _chunk_mask(plan, attention_mask, start, stop, keys, past, query, kv_heads)
        if mask.dtype == torch.bool:  # sdpa's boolean masks: True attends
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(mask)
        probs = probs_buffer[: batch * heads * rows * keys].view(batch, kv_heads, rows * groups, keys)
        torch.softmax(scores.view(batch, kv_heads, rows * groups, keys), dim=-1, out=probs)
        out = torch.matmul(probs, value[:, :, :keys])  # [batch, kv_heads, rows * groups, dim]
        out = out.view(batch, kv_heads, rows, groups, -1).permute(0, 2, 1, 3, 4).reshape(batch, rows, heads, -1)
        part = None
        if plan.rope.kernel == "eager":  # eager returns its weights: [batch, heads, rows, keys]; merge copies them
            part = probs.view(batch, kv_heads, rows, groups, keys).transpose(2, 3).reshape(batch, heads, rows, keys)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)


def _chunk_mask(
    plan: ForwardPlan,
    attention_mask: torch.Tensor | None,
    start: int,
    stop: int,
    keys: int,
    past: int,
    query: torch.Tensor,
    kv_heads: int,
) -> torch.Tensor:
    """:func:`rows_mask` as ``[batch or 1, 1 or kv_heads, rows, 1 or groups, keys]``; the causal mask for ``None``
    is built once per forward."""
    if attention_mask is not None:  # a layer's own mask (sliding-window layers differ from the others)
        mask = rows_mask(attention_mask, start, stop, keys, past, query.dtype, query.device)
        if mask.shape[1] == 1:
            return mask[:, :, :, None, :]
        # one mask per query head (Doge's dynamic masks): [batch, kv_heads * groups, rows, keys]
        return mask.unflatten(1, (kv_heads, -1)).transpose(2, 3)
    (mask,) = plan.tables(
        ("causal", start, stop, past, query.dtype),
        lambda: (rows_mask(None, start, stop, keys, past, query.dtype, query.device)[:, :, :, None, :],),
    )
    return mask


def _contiguous(plan: ForwardPlan, key_positions: torch.Tensor) -> bool:
    """Whether every batch row's key positions run contiguously (no left padding, no gaps)."""
    return plan.memo(("contiguous keys", key_positions.shape[1]), lambda: bool((key_positions.diff(dim=1) == 1).all()))


def _rotated_queries(
    plan: ForwardPlan,
    query: torch.Tensor,
    kv_heads: int,
    positions: torch.Tensor,
    rowwise: RowWise,
    kept: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The row-wise rows' queries rotated by position, times their multiplier squared and the softmax scaling.

    Rows ``[rowwise.start, rowwise.stop)``, pairs interleaved as ``(re, im)``, split into the
    turned pairs ``[batch, kv_heads, rows, groups, 2 * turned]`` and the kept pairs followed by
    the channels past ``rotary_dim`` (``[..., 2 * kept + rest]``, ``None`` when empty), each contiguous.
    """
    heads, dim, half = query.shape[1], query.shape[-1], plan.rope.rotary_dim // 2
    start, stop = rowwise.start, rowwise.stop

    def build():
        angles = positions[:, start:stop, None].float() * rowwise.inv_freq[:, start:stop]  # [batch, rows, half]
        scale = rowwise.scaling[:, start:stop, None].square() * scaling
        return (torch.complex(angles.cos() * scale, angles.sin() * scale),)

    (table,) = plan.tables(("q-rows", scaling), build)
    q = query[:, :, start:stop].unflatten(1, (kv_heads, heads // kv_heads)).transpose(2, 3)
    rotated = torch.view_as_real(torch.complex(q[..., :half], q[..., half : 2 * half]) * table[:, None, :, None])
    turned = rotated[..., kept:, :].flatten(-2)
    if kept == 0 and 2 * half == dim:
        return turned, None
    rest = (rotated[..., :kept, :].flatten(-2), q[..., 2 * half :] * scaling)
    return turned, torch.cat(rest, dim=-1)


def _shared_keys(
    plan: ForwardPlan, key: torch.Tensor, key_positions: torch.Tensor, rowwise: RowWise, kept: int
) -> torch.Tensor | None:
    """The key channels every row sees alike: the ``kept`` leading pairs rotated by position with their
    one frequency set (interleaved), then the channels past ``rotary_dim``; ``None`` when there are none.

    ``[batch, kv_heads, kv_len, 2 kept + head_dim - rotary_dim]``.
    """
    half, dim = plan.rope.rotary_dim // 2, key.shape[-1]
    if kept == 0 and 2 * half == dim:
        return None

    def build():
        angles = key_positions[..., None].float() * rowwise.inv_freq[:1, :1, :kept]  # [batch, kv_len, kept]
        return (torch.complex(angles.cos(), angles.sin()),)

    (table,) = plan.tables(("k-kept", key_positions.shape[1]), build)
    turned = torch.complex(key[..., :kept], key[..., half : half + kept]) * table[:, None]
    return torch.cat((torch.view_as_real(turned).flatten(-2), key[..., 2 * half :]), dim=-1)


def attend_rowwise_by_kernel(
    plan: ForwardPlan,
    kernel: Any,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: RowWise,
    merge: Any,
    kwargs: dict[str, Any],
) -> None:
    """Attend rows that each need their own frequencies, a chunk of rows per kernel call.

    Each (batch, row) of a chunk becomes one single-query item of a ``batch * chunk`` kernel
    call, with its own copy of the keys rotated by its frequencies. The reference for
    :func:`attend_rowwise`, and the path for what that does not implement (dropout, sinks,
    soft-capping).
    """
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    past = kv_len - seq
    for start, stop in _row_chunks(rowwise, key):
        rows, keys = stop - start, past + stop
        q = apply_rotary(query[:, :, start:stop], *_query_tables(plan, query, positions, rowwise, start, stop))
        k_cos, k_sin = _key_tables(plan, query, key_positions, rowwise, start, stop, keys)
        q = q.transpose(1, 2).reshape(batch * rows, heads, 1, dim)
        # every row's own rotation of the keys: [batch, rows, kv_heads, keys, dim]
        k = rotate(key[:, None, :, :keys], k_cos[:, :, None], k_sin[:, :, None]).reshape(batch * rows, kv_heads, keys, dim)
        v = value[:, None, :, :keys].expand(batch, rows, kv_heads, keys, value.shape[-1])
        v = v.reshape(batch * rows, kv_heads, keys, value.shape[-1])
        mask = rows_mask(attention_mask, start, stop, keys, past, query.dtype, query.device)
        mask = mask.expand(batch, -1, -1, -1).transpose(1, 2).reshape(batch * rows, mask.shape[1], 1, keys)
        out, part = kernel(module, q, k, v, mask, **kwargs)
        out = out.reshape(batch, rows, heads, out.shape[-1])
        if part is not None:
            part = part.reshape(batch, rows, part.shape[1], keys).transpose(1, 2)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)

