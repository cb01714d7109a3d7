"""The fp32 path of `rowwise.attend_rowwise`: each channel pair is one complex number.

Split from `rowwise` (the dispatch, the other dtypes' path and the kernel reference stay
there) so that each module reads in one sitting; `rows_mask` and `contiguous_keys`
live here, the lower of the two modules, and both use them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..inputs import AttentionInputs
from .forward_plan import ForwardPlan, RowWise
from .rotation import grid_factors, grid_product, grid_size


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


def kept_pairs(rowwise: RowWise) -> int:
    """How many leading channel pairs have the same frequency in every row: YaRN's high-frequency
    pairs, which it never interpolates, and dynamic NTK's first (theta^0 = 1 at any base)."""
    same = (rowwise.inv_freq == rowwise.inv_freq[:1, :1]).flatten(0, 1).all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def attend_complex(
    plan: ForwardPlan,
    inputs: AttentionInputs,
    key_positions: torch.Tensor,
    rowwise: RowWise,
    merge: Any,
    scaling: float,
    chunks: list[tuple[int, int]],
) -> None:
    """`rowwise.attend_rowwise` in fp32: each channel pair (i, i + rotary_dim / 2) is one complex number.

    A row's rotation of its keys is then one complex multiply per pair (``_rotate`` makes seven
    passes and a concatenation); its real view interleaves the pairs, and the queries are
    interleaved alike, which leaves the dot products unchanged. Each row's multiplier (YaRN's
    mscale, squared: it scales both sides) and its query rotation go on the queries, so that the
    keys turn by unit rotations. Only the pairs whose frequency differs between rows are
    rotated per row: the leading pairs with one frequency for all rows (`kept_pairs`) are
    rotated once per key and, with the channels past ``rotary_dim``, add one matmul over all rows
    of a chunk. With contiguous key positions a row's rotation of key ``j = a width + b`` is split
    in `_BLOCKS` blocks: the block's turn goes on a copy of the queries per block, so the
    keys turn by the row's short in-block table (``width`` entries) instead of a table as long as
    the keys, written and read per row. The per-row keys, tables and scores of a chunk go to the
    forward's scratch memory (`ForwardPlan.scratch`), laid out ``[batch, kv_heads, rows, ...]``
    so that the scores of a KV head's rows and groups are one ``[rows * groups, keys]`` matrix for
    the values.
    """
    query, key = inputs.query, inputs.key
    batch, heads, seq, _ = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups, past = heads // kv_heads, kv_len - seq
    half = plan.rope.rotary_dim // 2
    kept = plan.memo(("kept pairs",), lambda: kept_pairs(rowwise))
    turned = half - kept
    most = max(stop - start for start, stop in chunks)
    contiguous = contiguous_keys(plan, key_positions)
    padded = _padded_pairs(plan, key, kept, half)
    shared = _shared_keys(plan, key, key_positions, rowwise, kept)  # [batch, kv_heads, kv_len, 2 kept + rest] or None
    buffers = _buffers(plan, batch, heads, kv_heads, kv_len, most, turned, contiguous)
    queries, rest_queries = _rotated_queries(plan, query, kv_heads, plan.positions, rowwise, kept, scaling)
    for start, stop in chunks:
        rows, keys = stop - start, past + stop
        first, last = start - rowwise.start, stop - rowwise.start
        inv_freq = rowwise.inv_freq[:, start:stop, kept:]
        if contiguous:
            scores = _blocked_scores(
                plan, buffers, padded, queries[:, :, first:last], key_positions, inv_freq, start, keys
            )
        else:
            scores = _gathered_scores(buffers, padded, queries[:, :, first:last], key_positions, inv_freq, keys)
        if shared is not None:
            rest = rest_queries[:, :, first:last].flatten(2, 3).flatten(0, 1)  # [batch * kv_heads, rows * groups, c]
            scores.view(batch * kv_heads, rows * groups, keys).baddbmm_(
                rest, shared[:, :, :keys].flatten(0, 1).transpose(-1, -2)
            )
        out, part = _weighted_values(plan, inputs, buffers.probs, scores, start, past)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)


#: Blocks of keys in the contiguous-key path of `attend_complex` (each block's share of the
#: rotation goes on one copy of the queries; more blocks, shorter per-row tables and more copies).
_BLOCKS = 4


class _Buffers(NamedTuple):
    """`attend_complex`'s scratch memory, flat and sized for its largest chunk (each chunk views its share)."""

    table: torch.Tensor  # the keys' per-row rotation tables
    rotated: torch.Tensor  # the rotated keys, complex
    scores: torch.Tensor
    blocks: torch.Tensor  # the contiguous path's scores per block of keys
    probs: torch.Tensor


def _buffers(
    plan: ForwardPlan, batch: int, heads: int, kv_heads: int, kv_len: int, most: int, turned: int, contiguous: bool
) -> _Buffers:
    """The forward's scratch buffers for chunks of at most ``most`` rows over ``kv_len`` keys, ``turned`` pairs
    rotated per row (tables of `grid_size` entries per row when the keys are ``contiguous``, else ``kv_len``)."""
    width = -(-kv_len // _BLOCKS)
    table_size = batch * most * (grid_size(width) if contiguous else kv_len) * turned
    return _Buffers(
        table=plan.scratch("table", table_size, torch.complex64),
        rotated=plan.scratch("rotated", batch * kv_heads * most * (kv_len + _BLOCKS) * turned, torch.complex64),
        scores=plan.scratch("scores", batch * heads * most * (kv_len + _BLOCKS), torch.float32),
        blocks=plan.scratch("block scores", batch * heads * most * (kv_len + _BLOCKS), torch.float32),
        probs=plan.scratch("probs", batch * heads * most * kv_len, torch.float32),
    )


def _padded_pairs(plan: ForwardPlan, key: torch.Tensor, kept: int, half: int) -> torch.Tensor:
    """The keys' turned pairs (``kept .. half``) as complex numbers, then `_BLOCKS` finite (zero) pairs, so that
    whole blocks of keys can be read (the scores past a chunk's keys are dropped); the kept pairs and the
    channels past rotary_dim are rotated once for every row (`_shared_keys`).

    ``[batch, kv_heads, kv_len + _BLOCKS, half - kept]`` complex64, in the forward's scratch memory.
    """
    batch, kv_heads, kv_len = key.shape[0], key.shape[1], key.shape[2]
    turned = half - kept
    padded = plan.scratch("pairs", batch * kv_heads * (kv_len + _BLOCKS) * turned, torch.complex64)
    padded = padded.view(batch, kv_heads, kv_len + _BLOCKS, turned)
    torch.complex(key[..., kept:half], key[..., half + kept : 2 * half], out=padded[:, :, :kv_len])
    padded[:, :, kv_len:].zero_()
    return padded


def _blocked_scores(
    plan: ForwardPlan,
    buffers: _Buffers,
    padded: torch.Tensor,
    queries: torch.Tensor,
    key_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    start: int,
    keys: int,
) -> torch.Tensor:
    """The turned pairs' scores of a chunk's rows (from ``start``) against the first ``keys`` contiguous keys.

    Key ``j = a * width + b`` turns by ``exp(i (p_0 + a width) theta) exp(i b theta)``: the first factor goes
    on a copy of the ``queries`` ``[batch, kv_heads, rows, groups, 2 * turned]`` per block ``a``, the second,
    short, on the ``padded`` keys (`_padded_pairs`). ``inv_freq`` ``[batch, rows, turned]``.

    Returns ``[batch, kv_heads, rows, groups, keys]``, a view of ``buffers.scores``.
    """
    batch, kv_heads, _, turned = padded.shape
    rows, groups = queries.shape[2], queries.shape[3]
    width = -(-keys // _BLOCKS)
    coarse, *factors = plan.tables(  # keyed by the rows: layers with other KV shapes chunk otherwise
        ("k-blocks", _BLOCKS, start, start + rows, keys), lambda: _block_factors(key_positions, keys, inv_freq)
    )
    fine = grid_product(factors, width, out=buffers.table)  # [batch, rows, width, turned]
    size = batch * kv_heads * rows * _BLOCKS * width * turned
    rotated = buffers.rotated[:size].view(batch, kv_heads, rows, _BLOCKS, width, turned)
    blocked_keys = padded[:, :, None, : _BLOCKS * width].unflatten(3, (_BLOCKS, width))
    torch.mul(blocked_keys, fine[:, None, :, None], out=rotated)
    block_queries = torch.view_as_complex(queries.unflatten(-1, (turned, 2)))
    block_queries = block_queries[:, :, :, None] * coarse[:, None, :, :, None]  # [..., blocks, groups, turned]
    size = batch * kv_heads * groups * rows * _BLOCKS * width
    blocked = buffers.blocks[:size].view(batch, kv_heads, rows, _BLOCKS, groups, width)
    rotated = torch.view_as_real(rotated).flatten(-2).transpose(-1, -2)
    torch.matmul(torch.view_as_real(block_queries).flatten(-2), rotated, out=blocked)
    # [..., groups, blocks * width] in one copy; the keys past the chunk's are left out of the view
    scores = buffers.scores[:size].view(batch, kv_heads, rows, groups, _BLOCKS, width)
    return scores.copy_(blocked.transpose(3, 4)).flatten(-2)[..., :keys]


def _gathered_scores(
    buffers: _Buffers,
    padded: torch.Tensor,
    queries: torch.Tensor,
    key_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    keys: int,
) -> torch.Tensor:
    """`_blocked_scores` for key positions that do not run contiguously (left padding): each row's rotation
    table covers all its ``keys`` keys. Returns ``[batch, kv_heads, rows, groups, keys]`` in ``buffers.scores``."""
    batch, kv_heads, _, turned = padded.shape
    rows, groups = queries.shape[2], queries.shape[3]
    scores = buffers.scores[: batch * kv_heads * groups * rows * keys].view(batch, kv_heads, rows, groups, keys)
    angles = key_positions[:, None, :keys, None].float() * inv_freq[:, :, None, :]
    table = torch.complex(angles.cos(), angles.sin())  # [batch, rows, keys, turned]
    rotated = buffers.rotated[: batch * kv_heads * rows * keys * turned]
    rotated = rotated.view(batch, kv_heads, rows, keys, turned)
    torch.mul(padded[:, :, None, :keys], table[:, None], out=rotated)
    rotated = torch.view_as_real(rotated).flatten(-2).transpose(-1, -2)
    torch.matmul(queries, rotated, out=scores)
    return scores


def _weighted_values(
    plan: ForwardPlan, inputs: AttentionInputs, probs_buffer: torch.Tensor, scores: torch.Tensor, start: int, past: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chunk's rows from ``start`` on: ``scores`` ``[batch, kv_heads, rows, groups, keys]`` masked (in place),
    their softmax (into ``probs_buffer``) times the values.

    Returns ``out`` ``[batch, rows, heads, head_dim]`` and, for eager (which returns its weights), the
    probabilities ``[batch, heads, rows, keys]``, else ``None``.
    """
    query, value = inputs.query, inputs.value
    batch, kv_heads, rows, groups, keys = scores.shape
    heads = query.shape[1]
    mask = _chunk_mask(plan, inputs.attention_mask, start, start + rows, keys, past, query, kv_heads)
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
    return out, part


def _block_factors(
    key_positions: torch.Tensor, keys: int, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rotation of the first ``keys`` (contiguous) keys of rows with frequencies ``inv_freq``
    ``[batch, rows, turned]``, in `_BLOCKS` blocks of ``width = ceil(keys / _BLOCKS)`` keys.

    Returns ``conj(exp(i (p_0 + a width) theta))`` ``[batch, rows, _BLOCKS, turned]`` (for the
    queries: the conjugate, as the scores conjugate the keys) and `grid_factors` of
    ``exp(i b theta)``, ``b = 0 .. width - 1`` (for the keys).
    """
    width = -(-keys // _BLOCKS)
    steps = key_positions[:, :1] + torch.arange(_BLOCKS, device=key_positions.device) * width  # [batch, blocks]
    angles = steps[:, None, :, None].float() * inv_freq[:, :, None, :]
    coarse = torch.complex(angles.cos(), -angles.sin())
    last = torch.full((1,), width - 1, dtype=torch.long, device=key_positions.device)
    return (coarse, *grid_factors(last, width, inv_freq, None))


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
    """`rows_mask` as ``[batch or 1, 1 or kv_heads, rows, 1 or groups, keys]``; the causal mask for ``None``
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


def contiguous_keys(plan: ForwardPlan, key_positions: torch.Tensor) -> bool:
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
