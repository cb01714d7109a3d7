"""Attention over remapped positions: what the training-free methods (Self-Extend, DCA, STRING, ReRoPE) share.

`remap_attention` is transformers' attention function of a remapped model. It asks the
method for the pieces of each query block (a `layout.Layout`) and scores them by one of
two paths that agree to fp32 rounding: `flash_segments`' fused flash kernel per piece,
merged by log-sum-exp (CPU inference without a padding mask), or `segmented_attention`,
which concatenates each block's pieces into one ``[block, keys]`` score row under one fp32
softmax (masks, training, accelerators). The maths is in ``docs/methods/training_free.md``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from ..inputs import AttentionInputs
from ..maps import attention_maps_requested, kernel_function
from .flash_segments import flash_available, flash_segmented_attention
from .layout import Layout

#: The attribute of an attention module holding its `RemapState`.
STATE_ATTR = "_hf_posext_remap"
#: ``config._attn_implementation`` of the remapping wrapper of kernel ``k``: ``ATTENTION_PREFIX + k``.
ATTENTION_PREFIX = "hf_posext_remap_"
#: The ``attn_implementation`` a patched config.json carries: transformers without hf-posext refuses to
#: load it (rather than silently running plain RoPE); with it, the model gets the wrapper of sdpa
#: (or of the kernel ``from_pretrained(..., attn_implementation=...)`` asks for).
SAVED_ATTENTION = "hf_posext_remap (requires: import hf_posext)"
#: Score elements per head group and block: keeps one block's scores near 64 MiB in fp32.
BLOCK_ELEMENTS = 2**24


class Remapping(Protocol):
    """A method's position remapping, with its hyper-parameters resolved for one model."""

    name: str

    def active(self, last_position: int) -> bool:
        """Whether any pair up to query position ``last_position`` is scored at other positions."""
        ...

    def layout(self, query: torch.Tensor, key: torch.Tensor, past: int, offset: int, inv_freq: torch.Tensor) -> Layout:
        """The pieces for rows sharing ``offset``.

        ``query`` ``[rows, heads, seq, d]``, ``key`` ``[rows, kv_heads, kv_len, d]``.
        """
        ...

    def positioned_layout(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> Layout:
        """The pieces of one row without a cache whose tokens sit at ``positions`` ``[seq]`` (any increasing ids)."""
        ...


class RemapState:
    """What an attention module needs to remap positions; a plain object, so that it is never saved.

    Args:
        remapping: the method's remapping.
        rotary: the model's rotary module (its current ``inv_freq`` turns q and k).
        kernel: the model's own kernel, ``"eager"`` or ``"sdpa"``.
    """

    def __init__(self, remapping: Remapping, rotary: nn.Module, kernel: str) -> None:
        self.remapping = remapping
        self.rotary = rotary
        self.kernel = kernel
        self.hooks: list[Any] = []

    @property
    def attention_name(self) -> str:
        return ATTENTION_PREFIX + self.kernel


def remap_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention-interface function of the training-free methods.

    Inputs where no pair is remapped (all of them inside the method's window: Self-Extend's W,
    DCA's first chunk, STRING's shift, ReRoPE's w) go to the model's own kernel unchanged.
    With ``output_attentions`` the attention maps of the method's own scores come back, as eager
    returns its own (the score path; with sdpa, eager's where nothing is remapped).

    Args:
        module: an attention module carrying a `RemapState`.
        query: rotated ``[batch, heads, seq, head_dim]``.
        key, value: rotated keys and values, cache included, ``[batch, kv_heads, kv_len, head_dim]``.
        attention_mask: the kernel's mask ``[batch, 1 or heads, seq, kv_len]`` or ``None``.
        **kwargs: ``position_ids`` ``[batch or 1, seq]`` and the kernel's arguments.

    Returns:
        ``(output [batch, seq, heads, head_dim], maps [batch, heads, seq, kv_len] or None)``: the maps
        (softmax probabilities, after dropout, in the query's dtype) where ``output_attentions`` asks.
    """
    state: RemapState | None = getattr(module, STATE_ATTR, None)
    if state is None:
        raise ValueError(f"{type(module).__name__} is not set up for remapped attention; use hf_posext.patch_model")
    position_ids = kwargs.get("position_ids")
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(
            f"{state.remapping.name} needs the forward's position_ids among the attention arguments, "
            f"got {type(position_ids).__name__}"
        )
    refuse_unsupported(module, kwargs, state.remapping.name)
    if not state.remapping.active(int(position_ids[:, -1].max())):
        return kernel_function(state.kernel, module, kwargs)(module, query, key, value, attention_mask, **kwargs)
    batch, heads, seq, _ = query.shape
    kv_len = key.shape[2]
    past = kv_len - seq
    inv_freq = state.rotary.inv_freq
    if attention_mask is not None and attention_mask.shape[0] != batch:
        attention_mask = attention_mask.expand(batch, *attention_mask.shape[1:])
    inputs = AttentionInputs(module, query, key, value, attention_mask, kwargs)
    maps = new_maps(inputs)
    if seq > 1 and past == 0 and bool((position_ids.diff(dim=-1) < 0).any()):
        output = packed_attention(inputs, position_ids, maps)
    elif seq > 1 and bool((position_ids.diff(dim=-1) > 1).any()):
        output = positioned_attention(inputs, position_ids, state, maps)
    else:
        output = query.new_empty(batch, seq, heads, value.shape[-1], dtype=torch.float32)
        offsets = row_offsets(position_ids, batch, kv_len)
        for offset in torch.unique(offsets).tolist():
            rows = (offsets == offset).nonzero().flatten()
            every = rows.numel() == batch
            if every:
                rows_inputs, part = inputs, maps
            else:
                mask = None if attention_mask is None else attention_mask.index_select(0, rows)
                query_rows, key_rows, value_rows = (t.index_select(0, rows) for t in (query, key, value))
                rows_inputs = AttentionInputs(module, query_rows, key_rows, value_rows, mask, kwargs)
                part = None if maps is None else maps.index_select(0, rows)
            layout = state.remapping.layout(rows_inputs.query, rows_inputs.key, past, int(offset), inv_freq)
            out = attend(rows_inputs, layout, int(offset), part)
            if every:
                output = out
            else:
                output[rows] = out
                if part is not None and maps is not None:
                    maps[rows] = part
    return output.to(query.dtype), None if maps is None else maps.to(query.dtype)


def new_maps(inputs: AttentionInputs) -> torch.Tensor | None:
    """Zeros ``[batch, heads, seq, kv_len]`` fp32 for the attention maps where ``output_attentions`` asks, else None."""
    if not attention_maps_requested(inputs.module, inputs.kwargs):
        return None
    batch, heads, seq, _ = inputs.query.shape
    return inputs.query.new_zeros(batch, heads, seq, inputs.key.shape[2], dtype=torch.float32)


def positioned_attention(
    inputs: AttentionInputs, position_ids: torch.Tensor, state: RemapState, maps: torch.Tensor | None = None
) -> torch.Tensor:
    """`remap_attention` for position ids that jump forward (PoSE's chunks): pairs remapped from those ids.

    Every row is scored on its own, each pair by the variant its two positions select; the keys
    must be the new tokens themselves (no cache: the positions of cached keys are not known).
    ``maps`` (``[batch, heads, seq, seq]``), if given, receives the attention maps.

    Raises:
        ValueError: cached keys before jumping positions.
    """
    query, key, value, attention_mask = inputs.query, inputs.key, inputs.value, inputs.attention_mask
    batch, heads, seq, _ = query.shape
    if not hasattr(state.remapping, "positioned_layout"):
        raise ValueError(
            f"{state.remapping.name}: position_ids that jump (e.g. PoSE's chunks) are not supported by "
            "this method yet (it remaps contiguous positions only); give contiguous position_ids"
        )
    if key.shape[2] != seq:
        raise ValueError(
            f"{state.remapping.name}: position_ids that jump (e.g. PoSE's chunks) after cached keys "
            f"cannot be remapped (the cache does not keep its keys' positions); run such inputs "
            f"without a cache (use_cache=False)"
        )
    output = query.new_empty(batch, seq, heads, value.shape[-1], dtype=torch.float32)
    for row in range(batch):
        positions = position_ids[row if position_ids.shape[0] > 1 else 0]
        pick = slice(row, row + 1)
        mask = None if attention_mask is None else attention_mask[pick]
        row_inputs = AttentionInputs(inputs.module, query[pick], key[pick], value[pick], mask, inputs.kwargs)
        layout = state.remapping.positioned_layout(row_inputs.query, row_inputs.key, positions, state.rotary.inv_freq)
        part = None if maps is None else maps[pick]
        output[pick] = attend(row_inputs, layout, 0, part)
    return output.to(query.dtype)


def packed_attention(
    inputs: AttentionInputs, position_ids: torch.Tensor, maps: torch.Tensor | None = None
) -> torch.Tensor:
    """`remap_attention` for packed sequences (position ids that restart): each sequence on its own.

    Self-Extend's groups and DCA's chunks depend on a token's own position, not only on distances,
    so every sequence is remapped from its own ids (transformers' packed mask keeps the sequences
    apart; within one, the mask's block is the sequence's own causal mask). ``maps``
    (``[batch, heads, seq, seq]``), if given, receives each sequence's maps on its diagonal block.
    """
    query, key, value, attention_mask = inputs.query, inputs.key, inputs.value, inputs.attention_mask
    batch, heads, seq, _ = query.shape
    output = query.new_empty(batch, seq, heads, value.shape[-1], dtype=torch.float32)
    for row in range(batch):
        positions = position_ids[row if position_ids.shape[0] > 1 else 0]
        restarts = (positions.diff() < 0).nonzero().flatten() + 1
        bounds = [0, *restarts.tolist(), seq]
        for start, stop in zip(bounds[:-1], bounds[1:]):
            part = (slice(row, row + 1), slice(None), slice(start, stop))
            mask = None if attention_mask is None else attention_mask[row : row + 1, :, start:stop, start:stop]
            out, weights = remap_attention(
                inputs.module,
                query[part],
                key[part],
                value[part],
                mask,
                **{**inputs.kwargs, "position_ids": positions[start:stop].unsqueeze(0)},
            )
            output[row, start:stop] = out[0]
            if maps is not None and weights is not None:
                maps[row, :, start:stop, start:stop] = weights[0]
    return output.to(query.dtype)


def row_offsets(position_ids: torch.Tensor, batch: int, kv_len: int) -> torch.Tensor:
    """``[batch]`` offsets ``o`` with key column ``j`` at position ``j + o`` in each row.

    The last new token of a row sits at ``position_ids[:, -1]`` and the cache holds the keys before
    it contiguously (``DynamicCache``); left-padding columns get positions below the row's first
    real token, which they never need, being masked.
    """
    last = position_ids[:, -1].expand(batch) if position_ids.shape[0] == 1 else position_ids[:, -1]
    return last - (kv_len - 1)


def attend(inputs: AttentionInputs, layout: Layout, offset: int, maps: torch.Tensor | None = None) -> torch.Tensor:
    """The layout's attention by the fused path where it runs (no mask, `flash_available`), else the score path.

    Arguments as `segmented_attention`'s. Attention maps (``maps``) come from the score path only: the fused
    one never holds the probabilities.
    """
    if inputs.attention_mask is None and maps is None and flash_available(inputs.module, inputs.kwargs, inputs.query):
        scale = attention_scale(inputs.module, inputs.kwargs, inputs.value.shape[-1])
        return flash_segmented_attention(inputs, layout, offset, scale)
    return segmented_attention(inputs, layout, offset, maps)


def attention_scale(module: nn.Module, kwargs: dict[str, Any], head_dim: int) -> float:
    """The kernel's score scale: ``scaling`` among the arguments, else the module's, else ``head_dim ** -0.5``."""
    scaling = kwargs.get("scaling")
    return float(scaling if scaling is not None else getattr(module, "scaling", head_dim**-0.5))


def _block_size(heads: int, kv_len: int) -> int:
    return max(1, BLOCK_ELEMENTS // max(1, heads * kv_len))


def segmented_attention(
    inputs: AttentionInputs, layout: Layout, offset: int, maps: torch.Tensor | None = None
) -> torch.Tensor:
    """One softmax over each query row's pieces (rows sharing one position offset).

    Args:
        inputs: the call for these rows: the attention module (``scaling``, ``training``), the queries
            ``[rows, heads, seq, head_dim]`` (their shape: the layout holds what is scored), the keys
            ``[rows, kv_heads, kv_len, head_dim]`` (their length), the values alike, the kernel's mask for
            these rows, ``[rows, 1 or heads, seq, >= kv_len]`` bool (True: attend) or additive float, or ``None``
            (causal), and the attention arguments (``scaling``, ``dropout``, ``softcap``).
        layout: the method's pieces.
        offset: the rows' position offset (`row_offsets`).
        maps: ``[rows, heads, seq, >= kv_len]`` float32 that receives the probabilities (after dropout,
            as eager returns them), or ``None``.

    Returns:
        ``[rows, seq, heads, head_dim]`` float32.
    """
    module, value, attention_mask, kwargs = inputs.module, inputs.value, inputs.attention_mask, inputs.kwargs
    _, heads, seq, _ = inputs.query.shape
    rows, kv_heads, kv_len, _ = value.shape
    past = kv_len - seq
    groups = heads // kv_heads
    scaling = attention_scale(module, kwargs, value.shape[-1])
    softcap = kwargs.get("softcap")
    dropout = float(kwargs.get("dropout", 0.0) or 0.0) if module.training else 0.0
    value32 = value.to(torch.float32)
    output = value32.new_empty(rows, seq, heads, value.shape[-1])
    # In place only when autograd does not record: backward needs the scores each op would overwrite
    # (amax's input, tanh's output); in place keeps inference at one score matrix per block.
    inplace = not torch.is_grad_enabled()
    for start, stop in layout.blocks(past, seq, offset, _block_size(heads, kv_len)):
        block, keys = stop - start, past + stop
        scores = _block_scores(layout, start, stop, groups)
        scores = scores.mul_(scaling) if inplace else scores * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap)
            scores = scores.mul_(softcap) if inplace else scores * softcap
        scores = _masked(scores.view(rows, kv_heads, groups, block, keys), attention_mask, start, past, inplace)
        out, probs = _weighted_values(scores, value32[:, :, None, :keys], dropout, inplace, maps is not None)
        if maps is not None and probs is not None:
            maps[:, :, start:stop, :keys] = probs.reshape(rows, heads, block, keys)
        output[:, start:stop] = out.reshape(rows, heads, block, -1).transpose(1, 2)
    return output


def _block_scores(layout: Layout, start: int, stop: int, groups: int) -> torch.Tensor:
    """The raw scores ``q . k`` of query rows ``[start, stop)``, the layout's pieces side by side:
    ``[rows, heads, stop - start, keys]``, each piece's position choice (``first``, ``second``) per row."""
    parts = []
    for piece in layout.pieces(start, stop):
        part = torch.matmul(piece.query, piece.key.transpose(-1, -2))
        if piece.other is not None:
            alternative = torch.matmul(piece.other[0], piece.other[1].transpose(-1, -2))
            if piece.third is not None:
                third = torch.matmul(piece.third[0], piece.third[1].transpose(-1, -2))
                alternative = torch.where(piece.second.repeat(groups, 1), alternative, third)
            part = torch.where(piece.first.repeat(groups, 1), part, alternative)
        parts.append(part)
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def _masked(
    scores: torch.Tensor, attention_mask: torch.Tensor | None, start: int, past: int, inplace: bool
) -> torch.Tensor:
    """``scores`` ``[rows, kv_heads, groups, block, keys]`` of query rows from ``start`` on, masked: causally for
    ``attention_mask`` ``None``, else by its window (bool: True attends; float: added, floored at the dtype's
    minimum). In place when ``inplace``."""
    rows, kv_heads, groups, block, keys = scores.shape
    if attention_mask is None:
        columns = torch.arange(keys, device=scores.device)
        allowed = columns[None, :] <= torch.arange(past + start, past + start + block, device=scores.device)[:, None]
    else:
        # One mask for all heads ([rows, 1, ...]) or one per query head (Doge's dynamic mask,
        # [rows, heads, ...]: query head h reads kv head h // groups, as repeat_kv lays them out).
        window = attention_mask[:, :, start : start + block, :keys]
        allowed = window[:, :, None] if window.shape[1] == 1 else window.view(rows, kv_heads, groups, block, keys)
    # The floor is the dtype's own: under autocast the matmuls give bf16/fp16 scores, which fp32's
    # minimum overflows; an fp32 mask added out of place gives fp32 scores, floored as in fp32.
    if allowed.dtype == torch.bool:
        lowest = torch.finfo(scores.dtype).min
        return scores.masked_fill_(~allowed, lowest) if inplace else scores.masked_fill(~allowed, lowest)
    scores = scores.add_(allowed) if inplace else scores + allowed.to(torch.float32)
    lowest = torch.finfo(scores.dtype).min
    return scores.clamp_(min=lowest) if inplace else scores.clamp(min=lowest)


def _weighted_values(
    scores: torch.Tensor, values: torch.Tensor, dropout: float, inplace: bool, want_probs: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The softmax of masked ``scores`` ``[rows, kv_heads, groups, block, keys]`` times ``values``
    ``[rows, kv_heads, 1, keys, dim]`` (float32), after dropout. In place (``inplace``): exp of the shifted
    scores, the division by their sum after the matmul, and the probabilities only when ``want_probs``.

    Returns ``(out [rows, kv_heads, groups, block, dim], probabilities or None)``.
    """
    if inplace:
        scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
        total = scores.sum(dim=-1, keepdim=True)
        if dropout:
            scores = nn.functional.dropout(scores, p=dropout, training=True)
        out = torch.matmul(scores, values).div_(total)
        return out, scores.div_(total) if want_probs else None
    probs = torch.softmax(scores, dim=-1)
    if dropout:
        probs = nn.functional.dropout(probs, p=dropout, training=True)
    return torch.matmul(probs, values), probs


def refuse_unsupported(module: nn.Module, kwargs: dict[str, Any], name: str) -> None:
    """Attention features the remapping path does not implement raise rather than being ignored."""
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise ValueError(f"{name} does not support attention sinks ({type(module).__name__})")
