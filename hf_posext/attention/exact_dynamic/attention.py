"""transformers' attention-interface function for exact dynamic scaling, and its decoding path.

Queries and keys arrive un-rotated (the stand-in rotary module hands the layers the identity);
this rotates them with the frequencies of each query's length, then calls the wrapped kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from ..inputs import AttentionInputs
from ..maps import attention_maps_requested
from .forward_plan import (
    ACCELERATOR_CALL_MASK_BUDGET,
    ATTENTION_PREFIX,
    CALL_MASK_BUDGET,
    ROTATED_ATTR,
    STATE_ATTR,
    Call,
    ExactDynamicRope,
    ForwardPlan,
    RowWise,
)
from .rotation import apply_rotary, grid_rotations, interleave, rotate, uses_complex_rotation
from .rowwise import KERNEL_ONLY, attend_rowwise, attend_rowwise_by_kernel, rows_mask

logger = logging.getLogger("hf_posext")


def key_positions_of(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``[batch, kv_len]`` positions of the keys a layer attends to, ``positions`` being the new tokens'.

    The new tokens' keys come last and have the given positions; the cached ones before them are
    contiguous and end just before the first new token (what ``DynamicCache`` returns).
    """
    seq = positions.shape[1]
    if kv_len == seq:
        return positions
    if kv_len < seq:
        raise ValueError(f"the cache returned {kv_len} keys for {seq} new tokens; expected at least {seq}")
    offsets = torch.arange(kv_len - seq, 0, -1, device=positions.device)
    return torch.cat((positions[:, :1] - offsets, positions), dim=1)


def exact_dynamic_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention-interface function for exact dynamic scaling.

    Args:
        module: the attention module (carries the model's `ExactDynamicRope`).
        query: un-rotated ``[batch, heads, seq, head_dim]``.
        key, value: un-rotated keys and values, cache included, ``[batch, kv_heads, kv_seq, head_dim]``.
        attention_mask: the mask of the wrapped kernel, ``[batch, 1, seq, kv_seq]`` or ``None``.
        **kwargs: ``position_ids`` ``[batch or 1, seq]`` (finds the forward's plan); all are passed on to
            the kernel (``scaling``, ``dropout``, ...).

    Returns:
        ``(output [batch, seq, heads, head_dim], attention weights [batch, heads, seq, kv_seq] or None)``.
    """
    rope, position_ids = _rope_and_positions(module, kwargs)
    kernel = rope.kernel_for(module, kwargs)
    batch, _, seq, _ = query.shape
    kv_len = key.shape[2]
    native = rope.native_length(position_ids)
    if native is not None:  # queries and keys rotated by the layer, the cache's keys rotated before: plain attention
        _record_native(rope, module, key, seq, native)
        return kernel(module, query, key, value, attention_mask, **kwargs)
    plan = rope.plan(position_ids, batch)
    positions, calls = plan.positions, plan.calls
    if positions.shape != (batch, seq):
        raise ValueError(f"position_ids of shape {tuple(positions.shape)} for a layer with {batch} x {seq} query rows")
    layer = rope.cache_layer(module, key) if rope.stable else None
    if layer is not None:
        if plan.stable_length is not None and not key.requires_grad:  # autograd: never rotate the cache in place
            return _attend_rotated(
                plan, kernel, AttentionInputs(module, query, key, value, attention_mask, kwargs), layer
            )
        key = _unrotate(plan, key, layer, seq)
    inputs = AttentionInputs(module, query, key, value, attention_mask, kwargs)
    if plan.single and seq == 1 and calls[0].kept is None:  # kept positions break the offset-only rotation
        return _attend_decoding(plan, kernel, inputs, calls[0])
    key_positions = plan.memo(("key positions", kv_len), lambda: key_positions_of(positions, kv_len))
    if plan.single:
        return _attend_single(plan, kernel, inputs, key_positions)
    return _attend_calls(plan, kernel, inputs, key_positions)


def _rope_and_positions(module: nn.Module, kwargs: dict[str, Any]) -> tuple[ExactDynamicRope, torch.Tensor]:
    """The model's `ExactDynamicRope` that ``module`` carries and the forward's ``position_ids`` among the
    attention arguments ``kwargs``; a clear error when either is missing (attention called by hand)."""
    rope: ExactDynamicRope | None = getattr(module, STATE_ATTR, None)
    if rope is None:
        raise ValueError(
            f"{type(module).__name__} is not set up for exact dynamic attention; use hf_posext.patch_model "
            f"rather than setting attn_implementation={ATTENTION_PREFIX}... by hand"
        )
    position_ids = kwargs.get("position_ids")
    if not isinstance(position_ids, torch.Tensor):
        raise ValueError(
            f"exact dynamic attention needs the forward's position_ids among the attention arguments, got "
            f"{type(position_ids).__name__}; call the model (or its decoder layers with position_ids), not a bare "
            f"attention function"
        )
    return rope, position_ids


def _record_native(rope: ExactDynamicRope, module: nn.Module, key: torch.Tensor, seq: int, native: int) -> None:
    """A forward at a native length (the layer rotated queries and keys itself): the cache layer of ``module``
    records its ``key.shape[2]`` keys, the ``seq`` new ones included, as rotated with ``native``'s frequencies."""
    kv_len = key.shape[2]
    layer = rope.cache_layer(module, key)
    if layer is None:
        raise RuntimeError(
            f"exact cache: layer {getattr(module, 'layer_idx', '?')} lost track of its rotated keys "
            "(a cache layer of another kind); patch with exact_cache=False for this cache"
        )
    setattr(layer, ROTATED_ATTR, (_stored(layer, kv_len, seq)[0] + kv_len, native))


def _attend_single(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, key_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One frequency set for every query row (`ForwardPlan.single`): queries and keys rotated with it,
    ``key_positions`` ``[batch, kv_len]``, then one call of the wrapped kernel."""
    query, key, rope, call = inputs.query, inputs.key, plan.rope, plan.calls[0]
    kv_len, dtype = key.shape[2], query.dtype
    q_cos, q_sin = plan.tables(("q", 0), lambda: rope.cos_sin(call, plan.positions, dtype))
    k_cos, k_sin = plan.tables(("k", 0, kv_len), lambda: rope.cos_sin(call, key_positions, dtype))
    return kernel(
        inputs.module,
        apply_rotary(query, q_cos, q_sin),
        apply_rotary(key, k_cos, k_sin),
        inputs.value,
        inputs.attention_mask,
        **inputs.kwargs,
    )


def _attend_calls(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, key_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Query rows of several frequency sets (a prompt that crosses L_orig): the kernel once per block of
    each of the plan's calls (`call_blocks`), then the row-wise rows (`_attend_rowwise_rows`), each
    merged into one output for the rows it answers for. ``key_positions`` ``[batch, kv_len]``."""
    module, query, key, value = inputs.module, inputs.query, inputs.key, inputs.value
    attention_mask, kwargs = inputs.attention_mask, inputs.kwargs
    rope, positions = plan.rope, plan.positions
    batch, _, seq, _ = query.shape
    kv_len = key.shape[2]
    dtype = query.dtype
    past = kv_len - seq
    output = query.new_zeros(batch, seq, query.shape[1], value.shape[-1])
    weights: list[torch.Tensor | None] = [None]

    def merge(start: int, stop: int, rows: torch.Tensor, out: torch.Tensor, part: torch.Tensor | None) -> None:
        """Keep ``out`` (``[batch, stop - start, heads, head_dim]``) for the ``rows`` this call answers for."""
        output[:, start:stop] = torch.where(rows[:, :, None, None], out, output[:, start:stop])
        if part is not None:  # eager's attention weights, [batch, heads, stop - start, keys]
            if weights[0] is None:
                weights[0] = part.new_zeros(batch, part.shape[1], seq, kv_len)
            target = weights[0][:, :, start:stop, : part.shape[-1]]
            target.copy_(torch.where(rows[:, None, :, None], part, target))

    for index, call in enumerate(plan.calls):
        keys = past + call.stop
        q_pos, k_pos = positions[:, call.start : call.stop], key_positions[:, :keys]
        q_cos, q_sin = plan.tables(("q", index), lambda: rope.cos_sin(call, q_pos, dtype))
        k_cos, k_sin = plan.tables(("k", index, kv_len), lambda: rope.cos_sin(call, k_pos, dtype))
        rotated_query = apply_rotary(query[:, :, call.start : call.stop], q_cos, q_sin)
        rotated_key = apply_rotary(key[:, :, :keys], k_cos, k_sin)
        for start, stop in call_blocks(call, keys, query.device):
            first, last, seen = start - call.start, stop - call.start, past + stop
            out, part = kernel(
                module,
                rotated_query[:, :, first:last],
                rotated_key[:, :, :seen],
                value[:, :, :seen],
                rows_mask(attention_mask, start, stop, seen, past, dtype, query.device),
                **kwargs,
            )
            merge(start, stop, call.rows[:, first:last], out, part)  # a forward of many calls: rows never None
    if plan.rowwise is not None:
        _attend_rowwise_rows(plan, kernel, inputs, key_positions, plan.rowwise, merge)
    return output, weights[0]


def _attend_rowwise_rows(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, key_positions: torch.Tensor, rowwise: RowWise, merge: Any
) -> None:
    """The prompt rows that each attend to their own rotation of the keys (`ForwardPlan.rowwise`), batched
    in one pass where the kernel's arguments allow (`attend_rowwise`), else by the kernel row by row; each
    answer goes to ``merge``. Warns once on an accelerator, where this prefill is slow."""
    rope, query, kwargs = plan.rope, inputs.query, inputs.kwargs
    if query.device.type != "cpu" and not rope.warned_rowwise_on_accelerator:
        rope.warned_rowwise_on_accelerator = True
        logger.warning(
            "exact dynamic scaling: %d prompt rows past L_orig=%d on %s each attend to their own rotated "
            "copy of the keys (no fused kernel yet); on a GPU this prefill is many times slower than "
            "transformers' (hf-posext docs: results/gpu.md, the GPU check). "
            "Patch with exact_cache=False for fast long-prompt prefill.",
            rowwise.stop - rowwise.start,
            rope.original,
            query.device.type,
        )
    # the batched rows return eager's weights only for eager: maps for another kernel go through eager's
    batched = kwargs.get("dropout", 0.0) == 0.0 and not any(kwargs.get(k) is not None for k in KERNEL_ONLY)
    batched = batched and (rope.kernel == "eager" or not attention_maps_requested(inputs.module, kwargs))
    attend = attend_rowwise if batched else attend_rowwise_by_kernel
    attend(plan, kernel, inputs, key_positions, rowwise, merge)


def call_blocks(call: Call, keys: int, device: torch.device) -> Iterator[tuple[int, int]]:
    """The row ranges a call's rows go to the kernel in: ``[rows, keys]`` masks within ``CALL_MASK_BUDGET``.

    A call past L_orig (LongRoPE's long factors, YaRN's saturated rows) can span most of a long prompt;
    whole, its mask alone was ``rows * keys`` elements (24k x 32k: 3 GiB of fp32 for a 32k LongRoPE
    prompt) and building it took half the forward. A block of rows sees only the keys up to its last
    row, so the blocks together also skip most of the masked-out triangle.
    """
    budget = CALL_MASK_BUDGET if device.type == "cpu" else ACCELERATOR_CALL_MASK_BUDGET
    block = max(1, budget // max(1, keys))
    for start in range(call.start, call.stop, block):
        yield start, min(start + block, call.stop)


def _attend_rotated(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, layer: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every query at one stable length (``longrope`` before or past its switch, dynamic YaRN past saturation).

    The cache's keys are rotated in place with its frequencies, as transformers' rotary module would
    have, and ``layer`` records up to which token and with which length they are: the first such forward
    rotates its keys (a prefill, or the cache's un-rotated keys after a prompt that crossed L_orig),
    one whose cache holds keys of the other length turns them in one pass (LongRoPE's switch, or a cache
    cropped back before it), each later one only its new keys; attention is the plain kernel's.
    """
    query, key = inputs.query, inputs.key
    length, positions, kv_len, dtype = plan.stable_length, plan.positions, key.shape[2], query.dtype
    if id(layer) not in plan.rotated_layers:  # once per layer and forward
        plan.rotated_layers.add(id(layer))
        first, done, stored = _stored(layer, kv_len, query.shape[2])
        key_positions = plan.memo(("key positions", kv_len), lambda: key_positions_of(positions, kv_len))
        if done and stored != length:
            key[:, :, :done] = _turned(plan, key[:, :, :done], kv_len, key_positions[:, :done], stored, length)
        k_cos, k_sin = plan.tables(
            ("k rotated", length, done, kv_len),
            lambda: plan.rope.stable_cos_sin(length, key_positions[:, done:], dtype),
        )
        key[:, :, done:] = apply_rotary(key[:, :, done:], k_cos, k_sin)
        setattr(layer, ROTATED_ATTR, (first + kv_len, length))
    q_cos, q_sin = plan.tables(("q", 0), lambda: plan.rope.cos_sin(plan.calls[0], positions, dtype))
    rotated = apply_rotary(query, q_cos, q_sin)
    return kernel(inputs.module, rotated, key, inputs.value, inputs.attention_mask, **inputs.kwargs)


def _stored(layer: Any, kv_len: int, new: int) -> tuple[int, int, int | None]:
    """``(first, done, length)``: the sequence index of the first of the ``kv_len`` keys attention was handed
    (a sliding window's are the last ones), how many of them, before the ``new`` ones, are stored rotated,
    and the stable length they are rotated with; the layer counts the rotated tokens from the sequence's
    start (crop-safe: clamped)."""
    first = max(int(layer.get_seq_length()) - kv_len, 0)
    count, length = getattr(layer, ROTATED_ATTR, None) or (0, None)
    return first, max(0, min(int(count) - first, kv_len - new)), length


def _turned(
    plan: ForwardPlan, key: torch.Tensor, kv_len: int, positions: torch.Tensor, source: int, target: int | None
) -> torch.Tensor:
    """``key`` ``[batch, kv_heads, n, head_dim]``, the first ``n`` of ``kv_len`` keys handed to attention, stored
    rotated with the frequencies of the stable length ``source``, rotated with those of ``target`` instead
    (``None``: un-rotated), in one pass in fp32.

    With half tables ``(c_s, s_s)`` of ``source`` and ``(c_t, s_t)`` of ``target`` at ``positions``
    ``[batch, n]`` (multipliers and kept positions included), the rotation is ``T conj(S) / |S|^2`` as complex
    numbers: ``((c_t c_s + s_t s_s), (s_t c_s - c_t s_s)) / (c_s^2 + s_s^2)``; built from the tables themselves
    it undoes ``source``'s rotation to the tables' rounding (no difference of large fp32 angles)."""
    rope = plan.rope

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope.stable_cos_sin(source, positions, torch.float32)
        norm = cos.square() + sin.square()
        if target is None:
            return cos / norm, -sin / norm
        to_cos, to_sin = rope.stable_cos_sin(target, positions, torch.float32)
        return (to_cos * cos + to_sin * sin) / norm, (to_sin * cos - to_cos * sin) / norm

    cos, sin = plan.tables(("turn", source, target, kv_len, positions.shape[1]), build)
    return apply_rotary(key.float(), cos, sin).to(key.dtype)


def _unrotate(plan: ForwardPlan, key: torch.Tensor, layer: Any, new: int) -> torch.Tensor:
    """The keys attention was handed with the cache's rotated ones (`_attend_rotated`) turned back to
    un-rotated, as the other paths need them (a forward whose queries do not share one stable length: a prompt
    that crosses L_orig, a cache cropped back before saturation). The last ``new`` keys are this forward's own
    (un-rotated). In place, and the layer records none rotated; under autograd a copy, the cache left as it is."""
    _, done, stored = _stored(layer, key.shape[2], new)
    if not done:
        return key
    key_positions = plan.memo(("key positions", key.shape[2]), lambda: key_positions_of(plan.positions, key.shape[2]))
    turned = _turned(plan, key[:, :, :done], key.shape[2], key_positions[:, :done], stored, None)
    if key.requires_grad:
        return torch.cat((turned, key[:, :, done:]), dim=2)
    key[:, :, :done] = turned
    setattr(layer, ROTATED_ATTR, None)
    return key


def _attend_decoding(
    plan: ForwardPlan, kernel: Any, inputs: AttentionInputs, call: Call
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One new token per row (a decoding step): the query stays un-rotated, each key turns by its offset.

    RoPE scores depend on the offset only: ``R(p theta) q . R(j theta) k = q . R((j - p) theta) k``,
    and YaRN's mscale scales both sides, so each key is rotated by ``(j - p) theta`` times
    ``mscale^2`` and the query is used as it is. The offsets of a row's keys are ``-(kv_len - 1) ..
    0`` whatever its positions (left padding included), so one table serves every row that shares
    frequencies and all layers. In fp32 the rotation is one complex multiply; the channel pairs
    ``(i, i + rotary_dim / 2)`` then come out interleaved, and the query's are interleaved alike
    (a dot product does not see the order). Other dtypes and devices rotate with `_rotate`.
    """
    query, key = inputs.query, inputs.key
    kv_len, half = key.shape[2], plan.rope.rotary_dim // 2

    def rotation() -> torch.Tensor:  # [batch or 1, 1, kv_len, half] complex64, shared by the layers
        scaling = None if call.scaling is None else call.scaling.square()
        newest = torch.zeros(1, dtype=torch.long, device=call.inv_freq.device)  # offsets: the newest key is at 0
        return grid_rotations(newest, kv_len, call.inv_freq, scaling)[:, None]

    if not uses_complex_rotation(query, key):

        def real_tables() -> tuple[torch.Tensor, torch.Tensor]:
            table = rotation()
            return table.real.to(query.dtype), table.imag.to(query.dtype)

        cos, sin = plan.tables(("decode-real", kv_len, query.dtype), real_tables)
        return kernel(inputs.module, query, rotate(key, cos, sin), inputs.value, inputs.attention_mask, **inputs.kwargs)
    (table,) = plan.tables(("decode", kv_len), lambda: (rotation(),))
    # in scratch memory shared by the layers and kept for the next steps: a fresh copy of the key
    # cache per layer and step costs its page faults, as much as the rotation itself
    rotated = plan.scratch("decode keys", key.numel() // key.shape[-1] * half, torch.complex64)
    rotated = torch.complex(key[..., :half], key[..., half : 2 * half], out=rotated.view(*key.shape[:-1], half))
    rotated.mul_(table)
    rotated_key, interleaved_query = torch.view_as_real(rotated).flatten(-2), interleave(query, half)
    if 2 * half < key.shape[-1]:  # channels past rotary_dim are not rotated
        rotated_key = torch.cat((rotated_key, key[..., 2 * half :]), dim=-1)
        interleaved_query = torch.cat((interleaved_query, query[..., 2 * half :]), dim=-1)
    return kernel(inputs.module, interleaved_query, rotated_key, inputs.value, inputs.attention_mask, **inputs.kwargs)
