"""Dynamic NTK and dynamic YaRN that stay exact with a KV cache.

Dynamic scaling (YaRN paper, arXiv 2309.00071, section 3.3) recomputes the rotary frequencies
from the current sequence length L: dynamic NTK raises the base to
``theta * (s L / L_orig - (s - 1))^(d / (d - 2))`` (transformers' ``rope_type="dynamic"``), dynamic
YaRN uses YaRN (eqs. 17-22) at ``s(L) = min(factor, max(1, L / L_orig))``. transformers (and the
YaRN repository) rotate each key once, with the frequencies of the step that produced it, and
cache it rotated: once the scale changes the cache holds keys rotated with stale frequencies, so
cached generation differs from a forward pass over the same tokens (transformers issue 25104).
The YaRN paper itself says the fix: "cache the kv embeddings before applying RoPE".

What "exact" means here
-----------------------
A KV cache keeps every layer's keys and values of past tokens. In layer 2 and above those are
functions of the layer below's attention output, which was computed when the token was the last
one. No cache can be exact against transformers' *full forward*, which rotates every position of
a length-L input with the frequencies for L (the last token's): the earlier tokens' hidden states
would change at every step. hf-posext therefore defines dynamic scaling causally, which is what a
generating model sees and what the paper describes for generation:

    the token at position i attends with the frequencies (and YaRN mscale) for length i + 1:
    its query and every key j <= i it attends to are rotated by j * theta'(i + 1), scaled by
    mscale(i + 1).

Under this definition a full forward and cached decoding compute the same thing, token by token,
so ``use_cache=True`` and ``use_cache=False`` give the same logits at every step. A token's
prediction never depends on how long the input runs after it. Up to ``L_orig`` tokens it is plain
RoPE, as before; for a one-layer model it equals transformers' full forward at the last position.

Design
------
* The model's rotary module is replaced by :class:`ExactDynamicRotaryEmbedding`, which hands the
  layers the identity rotation (cos = 1, sin = 0). Queries and keys therefore reach the cache and
  the attention function *un-rotated*: whatever cache ``generate()`` builds (``DynamicCache`` by
  default, sliding-window layers included) stores pre-RoPE keys without knowing about it.
* ``config._attn_implementation`` is switched to a registered wrapper of the model's own kernel
  (``eager`` or ``sdpa``; ``hf_posext_exact_dynamic_<kernel>``, masked like the kernel). The wrapper
  rotates the queries and all keys with the frequencies of the query's length, then calls the
  kernel. Cached keys occupy the positions just before the new tokens (the cache returns a
  contiguous, most recent window), so their positions follow from the new tokens' ``position_ids``;
  left-padded batches work because each row keeps its own positions.
* Decoding (one new token per row, or any forward in which each row needs one frequency set) is a
  single kernel call. A forward in which rows need several frequency sets (a prompt longer than
  ``L_orig`` without cache) calls the kernel once per distinct length, on the rows that need it,
  with the mask sliced to those rows.
* Nothing is kept between forwards: frequencies follow from the positions of each call. A new,
  shorter sequence (a fresh cache) starts again from plain RoPE, and its logits equal those of a
  freshly patched model whatever ran before. (transformers only resets below ``L_orig``: a 2x
  sequence after a 3x one keeps the 3x frequencies.)

Trade-offs
----------
* Decoding re-rotates the whole key cache at every step (one elementwise pass over the keys per
  layer, with cos/sin tables built once per step and shared by the layers). That is the price of
  exactness without drift: re-rotating the stored keys in place by ``p * (theta_new - theta_old)``
  would accumulate one rounding per step (visible in bf16 after a few hundred steps); keeping
  pre-RoPE keys does not. See ``benchmarks/bench_dynamic_decode.py`` for the cost.
* A prompt longer than ``L_orig`` costs one kernel call per distinct length beyond ``L_orig`` in
  its prefill (O(prompt - L_orig) calls per layer); below ``L_orig`` it is one call.
* Supported kernels: ``eager`` and ``sdpa``. A cache must return its keys as a contiguous window
  ending at the newest token (``DynamicCache``, sliding or not; not ``StaticCache``).
* Loading a saved checkpoint with vanilla transformers gives transformers' behaviour (the config
  only carries the native rope type); call :func:`hf_posext.patch_model` again for the exact one.
* ``exact_cache=False`` on :class:`~hf_posext.DynamicNTKConfig` / :class:`~hf_posext.DynamicYarnConfig`
  keeps transformers' behaviour, for parity with numbers measured that way.

Example (runs on a laptop)::

    import hf_posext
    model = hf_posext.patch_model(model, "dynamic_yarn", factor=4)      # exact_cache=True
    out = model.generate(ids, max_new_tokens=3 * model.config.max_position_embeddings)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from . import _compat
from .methods.yarn import DYNAMIC_YARN_ROPE_TYPE, rotary_dim_of

#: The rope types whose frequencies depend on the sequence length, handled here.
EXACT_ROPE_TYPES = ("dynamic", DYNAMIC_YARN_ROPE_TYPE)
#: The attention kernels the exact wrapper can slice masks for.
SUPPORTED_KERNELS = ("eager", "sdpa")
#: ``config._attn_implementation`` while exact dynamic scaling is on is this prefix plus the kernel.
ATTENTION_PREFIX = "hf_posext_exact_dynamic_"

_STATE = "_hf_posext_exact_dynamic"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` the way Llama, Mistral and Qwen do (``rotate_half`` pairs i and i + d/2).

    Args:
        x: ``[batch, heads, seq, head_dim]``.
        cos, sin: ``[batch or 1, seq, rotary_dim]``; channels past ``rotary_dim`` are left as they are.

    Returns:
        ``[batch, heads, seq, head_dim]``, same dtype as ``x``.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return (x * cos) + (_rotate_half(x) * sin)
    rotated, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat(((rotated * cos) + (_rotate_half(rotated) * sin), rest), dim=-1)


def cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables as transformers' rotary modules build them, one frequency set per batch row.

    The angles and the cos/sin are computed in fp32 whatever ``dtype`` (positions beyond 256 are
    not integers in bf16), in the same order of operations as transformers, then cast.

    Args:
        positions: ``[batch, seq]`` integer positions.
        inv_freq: ``[batch or 1, rotary_dim // 2]`` fp32 frequencies.
        scaling: ``[batch or 1]`` fp32 cos/sin multiplier (YaRN's mscale; 1 for NTK).
        dtype: the dtype of the queries and keys.

    Returns:
        ``(cos, sin)``, each ``[batch, seq, rotary_dim]`` in ``dtype``.
    """
    freqs = positions[..., None].float() * inv_freq[:, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = scaling[:, None, None]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


@dataclass
class _Call:
    """One kernel call of a forward: query rows ``[start, stop)`` rotated with one frequency set per batch row."""

    start: int
    stop: int
    inv_freq: torch.Tensor  # [batch or 1, rotary_dim // 2], fp32
    scaling: torch.Tensor  # [batch or 1], fp32
    rows: torch.Tensor | None  # [batch, stop - start] bool: the rows this call answers for; None = all


class ExactDynamicRope:
    """Frequencies of a dynamic rope type as a function of the length, and the plan of the current forward.

    One instance per patched model, shared by its rotary stand-in (which starts each forward) and
    its attention modules (which read the plan).

    Args:
        config: the patched model config (``rope_type`` in :data:`EXACT_ROPE_TYPES`).
        kernel: the attention implementation the wrapper delegates to.
    """

    def __init__(self, config: Any, kernel: str) -> None:
        params = config.rope_parameters
        self.config = config
        self.rope_type = params["rope_type"]
        self.kernel = kernel
        self.attention_name = ATTENTION_PREFIX + kernel
        self.rotary_dim = rotary_dim_of(config)
        self._init_fn = _compat.rope_init_function(self.rope_type)
        if self.rope_type == "dynamic":
            # transformers' dynamic NTK reads L_orig from max_position_embeddings and never stops growing
            self.original = int(config.max_position_embeddings)
            self.saturation: int | None = None
        else:
            self.original = int(params["original_max_position_embeddings"])
            # s(L) = min(factor, L / L_orig) stops changing at the first L with L / L_orig >= factor
            self.saturation = math.ceil(float(params["factor"]) * self.original)
        self._calls: list[_Call] | None = None
        self._positions: torch.Tensor | None = None
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def frequency_length(self, lengths: torch.Tensor) -> torch.Tensor:
        """The smallest length with the same frequencies as each of ``lengths`` (same shape)."""
        return lengths.clamp(min=self.original, max=self.saturation)

    def frequencies(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(inv_freq [rotary_dim // 2] fp32, cos/sin multiplier)`` for a sequence of ``length`` tokens."""
        inv_freq, scaling = self._init_fn(self.config, device, seq_len=int(length))
        return inv_freq.to(device=device, dtype=torch.float32), float(scaling)

    def begin_forward(self, position_ids: torch.Tensor, batch: int) -> None:
        """Plan the kernel calls of a forward from its ``position_ids`` ``[batch or 1, seq]``."""
        positions = position_ids.expand(batch, -1)
        device = positions.device
        lengths = self.frequency_length(positions + 1)
        distinct = torch.unique(lengths).tolist()
        seq = positions.shape[1]
        if len(distinct) == 1 or bool((lengths == lengths[:, :1]).all()):
            # One frequency set per row (decoding, or a prompt within one regime): one kernel call.
            by_length = {length: self.frequencies(length, device) for length in distinct}
            per_row = [by_length[length] for length in lengths[:, 0].tolist()]
            inv_freq = torch.stack([f for f, _ in per_row])
            scaling = torch.tensor([s for _, s in per_row], dtype=torch.float32, device=device)
            calls = [_Call(0, seq, inv_freq, scaling, None)]
        else:
            calls = []
            for length in distinct:
                rows = lengths == length
                touched = rows.any(dim=0).nonzero().flatten().tolist()
                start, stop = touched[0], touched[-1] + 1
                inv_freq, scaling = self.frequencies(length, device)
                scale = torch.tensor([scaling], dtype=torch.float32, device=device)
                calls.append(_Call(start, stop, inv_freq[None], scale, rows[:, start:stop]))
        self._positions = positions
        self._calls = calls
        self._tables = {}

    def plan(self) -> tuple[torch.Tensor, list[_Call]]:
        """``(query positions [batch, seq], calls)`` of the current forward."""
        if self._calls is None or self._positions is None:
            raise RuntimeError(
                "exact dynamic attention ran before the model's rotary embedding: call the model, not a bare layer"
            )
        return self._positions, self._calls

    def tables(
        self, index: int, kind: str, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of call ``index`` for ``positions``, computed once per forward and shared by the layers."""
        key = (index, kind, positions.shape[-1], dtype)
        if key not in self._tables:
            call = self._calls[index]
            self._tables[key] = cos_sin(positions, call.inv_freq, call.scaling, dtype)
        return self._tables[key]


class ExactDynamicRotaryEmbedding(nn.Module):
    """Stands in for a model's rotary module while exact dynamic scaling is on.

    It returns the identity rotation, so queries and keys reach the cache un-rotated, and plans
    the attention wrapper's rotations from the forward's ``position_ids``.

    Args:
        rotary: the dynamic rotary module it replaces (kept as ``.rotary`` to be put back).
        rope: the model's shared :class:`ExactDynamicRope`.
    """

    def __init__(self, rotary: nn.Module, rope: ExactDynamicRope) -> None:
        super().__init__()
        self.rotary = rotary
        self.rope = rope

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Identity ``(cos, sin)``, ``[batch, seq, rotary_dim]`` in ``x.dtype``, for ``position_ids`` ``[batch or 1, seq]``."""
        current = self.rope.config._attn_implementation
        if current != self.rope.attention_name:
            raise ValueError(
                f"attn_implementation was changed to {current!r} after exact dynamic scaling was enabled (it needs "
                f"{self.rope.attention_name!r}); call hf_posext.patch_model again after changing it"
            )
        self.rope.begin_forward(position_ids, x.shape[0])
        shape = (x.shape[0], position_ids.shape[-1], self.rope.rotary_dim)
        one = torch.ones((), dtype=x.dtype, device=x.device).expand(shape)
        zero = torch.zeros((), dtype=x.dtype, device=x.device).expand(shape)
        return one, zero


def _key_positions(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
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


def _rows_mask(
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
        module: the attention module (carries the model's :class:`ExactDynamicRope`).
        query: un-rotated ``[batch, heads, seq, head_dim]``.
        key, value: un-rotated keys and values, cache included, ``[batch, kv_heads, kv_seq, head_dim]``.
        attention_mask: the mask of the wrapped kernel, ``[batch, 1, seq, kv_seq]`` or ``None``.
        **kwargs: passed on to the kernel (``scaling``, ``dropout``, ...).

    Returns:
        ``(output [batch, seq, heads, head_dim], attention weights [batch, heads, seq, kv_seq] or None)``.
    """
    rope: ExactDynamicRope | None = getattr(module, _STATE, None)
    if rope is None:
        raise ValueError(
            f"{type(module).__name__} is not set up for exact dynamic attention; use hf_posext.patch_model "
            f"rather than setting attn_implementation={ATTENTION_PREFIX}... by hand"
        )
    kernel = _compat.attention_function(rope.kernel, module)
    positions, calls = rope.plan()
    batch, _, seq, _ = query.shape
    kv_len = key.shape[2]
    if positions.shape != (batch, seq):
        raise ValueError(f"the forward was planned for positions {tuple(positions.shape)}, the layer got {seq} rows")
    key_positions = _key_positions(positions, kv_len)
    dtype = query.dtype
    if len(calls) == 1:
        q_cos, q_sin = rope.tables(0, "q", positions, dtype)
        k_cos, k_sin = rope.tables(0, "k", key_positions, dtype)
        return kernel(
            module, apply_rotary(query, q_cos, q_sin), apply_rotary(key, k_cos, k_sin), value, attention_mask, **kwargs
        )
    past = kv_len - seq
    output = query.new_zeros(batch, seq, query.shape[1], value.shape[-1])
    weights = None
    for index, call in enumerate(calls):
        keys = past + call.stop
        q_cos, q_sin = rope.tables(index, "q", positions[:, call.start : call.stop], dtype)
        k_cos, k_sin = rope.tables(index, "k", key_positions[:, :keys], dtype)
        out, part = kernel(
            module,
            apply_rotary(query[:, :, call.start : call.stop], q_cos, q_sin),
            apply_rotary(key[:, :, :keys], k_cos, k_sin),
            value[:, :, :keys],
            _rows_mask(attention_mask, call.start, call.stop, keys, past, dtype, query.device),
            **kwargs,
        )
        rows = call.rows[:, :, None, None]
        output[:, call.start : call.stop] = torch.where(rows, out, output[:, call.start : call.stop])
        if part is not None:
            if weights is None:
                weights = part.new_zeros(batch, part.shape[1], seq, kv_len)
            target = weights[:, :, call.start : call.stop, :keys]
            weights[:, :, call.start : call.stop, :keys] = torch.where(rows.transpose(1, 2), part, target)
    return output, weights


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    # Llama/Mistral/Qwen attention modules: the ones that own k_proj and a layer index.
    return [m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m, "layer_idx")]


def enable_exact_dynamic_cache(model: nn.Module) -> None:
    """Make a model patched with ``dynamic_ntk`` / ``dynamic_yarn`` exact with a KV cache (see module docs).

    A no-op when the config's rope type is not dynamic (``factor=1`` patches plain RoPE).
    Called by :func:`hf_posext.patch_model` for ``exact_cache=True``.

    Raises:
        ValueError: an attention implementation other than ``eager``/``sdpa``, or no attention modules.
    """
    disable_exact_dynamic_cache(model)
    config = model.config
    if (config.rope_parameters or {}).get("rope_type") not in EXACT_ROPE_TYPES:
        return
    kernel = config._attn_implementation or "eager"
    if kernel not in SUPPORTED_KERNELS:
        raise ValueError(
            f"exact_cache=True supports attn_implementation in {SUPPORTED_KERNELS}, got {kernel!r}; load the model "
            f"with one of those or patch with exact_cache=False (transformers' behaviour, stale cached keys)"
        )
    attention = _attention_modules(model)
    if not attention:
        raise ValueError(f"{type(model).__name__} has no attention module (with k_proj and layer_idx) to patch")
    rope = ExactDynamicRope(config, kernel)
    _compat.register_attention_wrapper(rope.attention_name, exact_dynamic_attention, mask_like=kernel)
    for name, rotary in list(_compat.rotary_modules(model)):
        _compat.replace_module(model, name, ExactDynamicRotaryEmbedding(rotary, rope))
    for module in attention:
        setattr(module, _STATE, rope)
    config._attn_implementation = rope.attention_name


def disable_exact_dynamic_cache(model: nn.Module) -> None:
    """Undo :func:`enable_exact_dynamic_cache` (a no-op if it is not enabled)."""
    stand_ins = [(n, m) for n, m in model.named_modules() if isinstance(m, ExactDynamicRotaryEmbedding)]
    for name, module in stand_ins:
        _compat.replace_module(model, name, module.rotary)
    rope = None
    for module in model.modules():
        if _STATE in module.__dict__:
            rope = module.__dict__.pop(_STATE)
    if rope is not None and model.config._attn_implementation == rope.attention_name:
        model.config._attn_implementation = rope.kernel
