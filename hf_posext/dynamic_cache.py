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
* Decoding (one new token per row) is a single kernel call with the query left as it is and each
  key rotated by its offset to the query, ``(j - p) * theta'``, times YaRN's ``mscale^2``: RoPE
  scores depend on the offset only, and the offsets ``-(kv_len - 1) .. 0`` are the same for every
  row, so one table per step serves all layers (and all rows of the same length, beams included)
  and the query needs no rotation. In fp32 that rotation is one complex multiply. Any other
  forward in which each row needs one frequency set (a prompt within one regime) is one kernel
  call too, queries and keys rotated by position.
* In a forward whose rows need many frequency sets (a prompt longer than ``L_orig``), the rows up
  to ``L_orig`` (and, for YaRN, from ``factor * L_orig`` on) share one call; every row in between
  needs its own rotation of the keys. Those rows are attended in chunks, one batched computation
  per chunk (the eager kernel's arithmetic written out: each row's rotated keys, a batched matmul
  with its queries, the mask, softmax in fp32, then the values), chunks bounded to
  ``_ROWWISE_BUDGET`` rotated-key elements. The same rows sent to the kernel as a batch of
  single-query problems (``_attend_rowwise_by_kernel``) are the reference it is tested against,
  and the path for kernel options it does not implement (dropout, sinks, soft-capping).
* Nothing is kept between forwards: frequencies follow from the positions of each call. A new,
  shorter sequence (a fresh cache) starts again from plain RoPE, and its logits equal those of a
  freshly patched model whatever ran before. (transformers only resets below ``L_orig``: a 2x
  sequence after a 3x one keeps the 3x frequencies; vanilla transformers also keeps YaRN's grown
  mscale after that reset, which ``exact_cache=False`` restores.)

Trade-offs
----------
* Decoding re-rotates the whole key cache at every step: per layer, one pass that pairs the key
  channels into complex numbers and one complex multiply, plus one rotation table per step
  (:func:`grid_rotations`) shared by the layers. That is the price of exactness without drift:
  re-rotating the stored keys in place by ``p * (theta_new - theta_old)`` would accumulate one
  rounding per step (visible in bf16 after a few hundred steps); keeping pre-RoPE keys does not.
  The cost grows with the key cache relative to the weights (long contexts, many KV heads, large
  batches). A kernel that rotates keys as it reads them would remove it; none is used here.
  Measured with ``benchmarks/bench_dynamic_decode.py`` (defaults: 4-layer Llama, hidden 512,
  8 heads / 2 KV heads, sdpa, decoding the last 64 tokens up to 4x L_orig = 1024, fp32, one CPU
  thread): 0.88-0.93x the tokens/s of the static method of the same factor, median 0.90, for
  both methods over 15 runs; transformers' own dynamic path, the same code as static plus one
  frequency update per step, reads 0.93-1.06x in the same runs. Rotating the query and the keys
  by position, as before the offset form, measured 0.85x and 0.86x. Where the time goes (same
  benchmark, per decoding step of ~7.5 ms): ~640 us re-rotating the keys (4 layers; the key
  cache is cold after each layer's weights stream through, so the two passes run at memory
  speed, ~3x their in-cache time), ~65 us the table, ~70 us the per-length frequencies, ~140 us
  the rest (planning, identity rotation, Python). ``torch.compile`` of the rotation was slower
  on CPU (84 vs 60 us per call in cache, guard overhead).
* Prefill past ``L_orig`` does O(prompt^2 * head_dim * kv_heads) elementwise work for the rows'
  own key rotations, plus their rotation tables (O(prompt^2 * rotary_dim), built per layer once
  they exceed ``_TABLE_BUDGET``: one complex multiply per entry from :func:`grid_rotations` when
  the key positions are contiguous, cos and sin otherwise, e.g. left-padded batches); attention
  itself is O(prompt^2 * head_dim) too, but as a matmul. So long prompts prefill several times
  slower than with transformers' rule. Measured with ``benchmarks/bench_patch_overhead.py``
  (4-layer Llama, hidden 256, 4 heads / 2 KV heads, sdpa, L_orig 256, factor 8, fp32, 2 CPU
  cores): prefill / native dynamic forward = 4.4x (NTK) and 5.0x (YaRN) at 1024 tokens, 5.6x and
  5.8x at 2048. The steps there: 12-16x and 15-32x when each chunk of rows went through the
  kernel, 6.2x/5.1x and 8.9x/9.1x with cos/sin tables. In fp32 a row's key rotation is one
  complex multiply; other dtypes use :func:`apply_rotary`'s real arithmetic.
* Every forward reads its lengths back to the host (one sync), so it does not capture in CUDA
  graphs. Supported kernels: ``eager`` and ``sdpa``. A cache must return its keys as a contiguous
  window ending at the newest token (``DynamicCache``, sliding or not); a preallocated one
  (``StaticCache``, ``cache_implementation="static"``) is refused with a ``ValueError``.
* A saved checkpoint records the patch in ``config.hf_posext`` but never the wrapper's name.
  ``from_pretrained`` after ``import hf_posext`` makes it exact again while it builds the model
  (:meth:`~hf_posext.methods.base.PositionMethod.on_rotary_init`), wrapping the kernel transformers
  resolves: ``attn_implementation="eager"`` or ``"sdpa"`` as passed, sdpa by default; any other
  raises. Vanilla transformers loads dynamic NTK with its own behaviour (the config carries the
  native ``dynamic`` type) and refuses dynamic YaRN, whose rope type is hf-posext's.
* ``exact_cache=False`` on :class:`~hf_posext.DynamicNTKConfig` / :class:`~hf_posext.DynamicYarnConfig`
  keeps transformers' behaviour, for parity with numbers measured that way.

Example (runs on a laptop)::

    import hf_posext
    model = hf_posext.patch_model(model, "dynamic_yarn", factor=4)      # exact_cache=True
    out = model.generate(ids, max_new_tokens=3 * model.config.max_position_embeddings)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
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


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` the way Llama, Mistral and Qwen do: channel i pairs with i + rotary_dim / 2.

    Bit for bit transformers' ``x * cos + rotate_half(x) * sin``, written on the half tables so
    that a decoding step, which re-rotates the whole key cache, makes fewer passes over it.

    Args:
        x: ``[batch, heads, seq, head_dim]``.
        cos, sin: half tables ``[batch or 1, seq, rotary_dim // 2]``; channels past ``rotary_dim``
            are left as they are.

    Returns:
        ``[batch, heads, seq, head_dim]``, same dtype as ``x``.
    """
    return _rotate(x, cos.unsqueeze(1), sin.unsqueeze(1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rotary` with tables that already broadcast against ``x`` (last dim rotary_dim // 2)."""
    half = cos.shape[-1]
    first, second = x[..., :half], x[..., half : 2 * half]
    parts = [first * cos - second * sin, second * cos + first * sin]
    if 2 * half < x.shape[-1]:  # the tables may broadcast x to more dims (one copy of the keys per row)
        parts.append(x[..., 2 * half :].expand(*parts[0].shape[:-1], -1))
    return torch.cat(parts, dim=-1)


def cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half cos/sin tables as transformers' rotary modules build them, one frequency set per batch row.

    The angles and the cos/sin are computed in fp32 whatever ``dtype`` (positions beyond 256 are
    not integers in bf16), with the same operations as transformers, then cast. transformers
    duplicates the angles before the cos; the halves hold the same values at half the cost.

    Args:
        positions: ``[batch, seq]`` integer positions.
        inv_freq: ``[batch or 1, rotary_dim // 2]`` fp32 frequencies.
        scaling: ``[batch or 1]`` fp32 cos/sin multiplier (YaRN's mscale), or ``None`` when all are 1.
        dtype: the dtype of the queries and keys.

    Returns:
        ``(cos, sin)``, each ``[batch, seq, rotary_dim // 2]`` in ``dtype``.
    """
    freqs = positions[..., None].float() * inv_freq[:, None, :]
    cos, sin = freqs.cos(), freqs.sin()
    if scaling is not None:  # None: every multiplier is 1 (NTK), and x * 1 == x
        scale = scaling[:, None, None]
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


#: Elements of rotated-key copies the row-wise path may build at once, and of cos/sin tables a
#: forward may keep for its layers (beyond that they are recomputed per layer). Small chunks are
#: faster, not only leaner: at 2048 tokens (bench_patch_overhead.py, CPU) 1 << 21 prefilled in
#: 1.25 s, 1 << 24 (64 MB temporaries, freshly page-faulted per chunk) in 2.4 s, 1 << 18 in 3.1 s
#: (per-call overhead).
_ROWWISE_BUDGET = 1 << 21
_TABLE_BUDGET = 1 << 25


@dataclass
class _Call:
    """One kernel call: query rows ``[start, stop)`` rotated with one frequency set per batch row."""

    start: int
    stop: int
    inv_freq: torch.Tensor  # [batch or 1, rotary_dim // 2], fp32
    scaling: torch.Tensor | None  # [batch or 1], fp32; None when every multiplier is 1
    rows: torch.Tensor | None  # [batch, stop - start] bool: the rows this call answers for; None = all


@dataclass
class _RowWise:
    """Query rows that each need their own frequencies (lengths between L_orig and saturation).

    They are attended in chunks, every (batch, row) as its own single-query problem, so that a
    prompt past L_orig costs a few kernel calls rather than one per row.
    """

    start: int
    stop: int
    inv_freq: torch.Tensor  # [batch, seq, rotary_dim // 2], fp32: each row's own frequencies
    scaling: torch.Tensor  # [batch, seq], fp32
    rows: torch.Tensor  # [batch, seq] bool: the rows this path answers for


def _complex_rotation(x: torch.Tensor) -> bool:
    """Whether ``x``'s rotations take the complex-multiply path: fp32 (no complex type rounds like
    bf16/fp16) on CPU or CUDA (other backends' complex support is partial); else :func:`_rotate`."""
    return x.dtype == torch.float32 and x.device.type in ("cpu", "cuda")


def _multipliers(values: list[float], device: torch.device) -> torch.Tensor | None:
    """The cos/sin multipliers as a ``[len(values)]`` fp32 tensor, or ``None`` when all are 1."""
    if all(value == 1.0 for value in values):
        return None
    return torch.tensor(values, dtype=torch.float32, device=device)


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
        self._frequencies: dict[tuple[int, str], tuple[torch.Tensor, float]] = {}
        self._positions: torch.Tensor | None = None
        self._calls: list[_Call] = []
        self._rowwise: _RowWise | None = None
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._table_elements = 0
        self._memo: dict[tuple, Any] = {}
        self._kernels: dict[type, Any] = {}
        self.hooks: list[Any] = []  # removable handles of the base model's cache guard

    def frequency_length(self, lengths: torch.Tensor) -> torch.Tensor:
        """The smallest length with the same frequencies as each of ``lengths`` (same shape)."""
        return lengths.clamp(min=self.original, max=self.saturation)

    def frequencies(self, length: int, device: torch.device | str) -> tuple[torch.Tensor, float]:
        """``(inv_freq [rotary_dim // 2] fp32, cos/sin multiplier)`` for a sequence of ``length`` tokens."""
        key = (int(length), str(device))
        if key not in self._frequencies:
            if len(self._frequencies) >= 64:  # decoding asks for a new length per step: keep the recent ones
                self._frequencies.pop(next(iter(self._frequencies)))
            inv_freq, scaling = self._init_fn(self.config, device, seq_len=int(length))
            self._frequencies[key] = (inv_freq.to(device=device, dtype=torch.float32), float(scaling))
        return self._frequencies[key]

    def begin_forward(self, position_ids: torch.Tensor, batch: int) -> None:
        """Plan the kernel calls of a forward from its ``position_ids`` ``[batch or 1, seq]``."""
        positions = position_ids.expand(batch, -1)
        device = positions.device
        lengths = self.frequency_length(positions + 1)
        seq = positions.shape[1]
        self._positions, self._calls, self._rowwise = positions, [], None
        self._tables, self._table_elements, self._memo = {}, 0, {}
        if seq == 1 or bool((lengths == lengths[:, :1]).all()):
            # One frequency set per row (decoding, or a prompt within one regime): one kernel call.
            row_lengths = lengths[:, 0].tolist()
            if len(set(row_lengths)) == 1:  # rows of one length (no padding, beams) share one frequency set
                row_lengths = row_lengths[:1]
            per_row = [self.frequencies(length, device) for length in row_lengths]
            inv_freq = torch.stack([f for f, _ in per_row])
            scaling = _multipliers([s for _, s in per_row], device)
            self._calls = [_Call(0, seq, inv_freq, scaling, None)]
            return
        # Lengths up to L_orig (and, for YaRN, from saturation on) share one frequency set: one
        # multi-row kernel call each. Every length in between belongs to a single position.
        shared = torch.zeros_like(lengths, dtype=torch.bool)
        for length in (self.original, self.saturation):
            rows = lengths == length
            touched = rows.any(dim=0).nonzero().flatten().tolist() if length is not None else []
            if not touched:
                continue
            start, stop = touched[0], touched[-1] + 1
            inv_freq, scaling = self.frequencies(length, device)
            self._calls.append(_Call(start, stop, inv_freq[None], _multipliers([scaling], device), rows[:, start:stop]))
            shared |= rows
        own = ~shared
        touched = own.any(dim=0).nonzero().flatten().tolist()
        if touched:
            distinct, index = torch.unique(lengths, return_inverse=True)
            table = [self.frequencies(length, device) for length in distinct.tolist()]
            inv_freq = torch.stack([f for f, _ in table])[index]
            scaling = torch.tensor([s for _, s in table], dtype=torch.float32, device=device)[index]
            self._rowwise = _RowWise(touched[0], touched[-1] + 1, inv_freq, scaling, own)

    def plan(self) -> tuple[torch.Tensor, list[_Call], _RowWise | None]:
        """``(query positions [batch, seq], multi-row calls, row-wise rows)`` of the current forward."""
        if self._positions is None:
            raise RuntimeError(
                "exact dynamic attention ran before the model's rotary embedding: call the model, not a bare layer"
            )
        return self._positions, self._calls, self._rowwise

    def kernel_for(self, module: nn.Module) -> Any:
        """The wrapped kernel's attention function for ``module`` (looked up once per module class)."""
        kind = type(module)
        if kind not in self._kernels:
            self._kernels[kind] = _compat.attention_function(self.kernel, module)
        return self._kernels[kind]

    def memo(self, key: tuple, build: Any) -> Any:
        """``build()``, once per forward (for small per-forward values shared by the layers)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def tables(self, key: tuple, build: Any) -> tuple[torch.Tensor, ...]:
        """Rotation tables (cos/sin, or complex) under ``key``, built once per forward and shared by the layers.

        Past ``_TABLE_BUDGET`` fp32 elements' worth a forward stops keeping them (a long prompt's
        row-wise tables would not fit) and they are rebuilt per layer.
        """
        if key in self._tables:
            return self._tables[key]
        built = build()
        size = sum(t.numel() * t.element_size() for t in built) // 4
        if self._table_elements + size <= _TABLE_BUDGET:
            self._tables[key] = built
            self._table_elements += size
        return built


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
    kernel = rope.kernel_for(module)
    positions, calls, rowwise = rope.plan()
    batch, _, seq, _ = query.shape
    kv_len = key.shape[2]
    if positions.shape != (batch, seq):
        raise ValueError(f"the forward was planned for positions {tuple(positions.shape)}, the layer got {seq} rows")
    single = rowwise is None and len(calls) == 1 and calls[0].rows is None
    if single and seq == 1:
        return _attend_decoding(rope, kernel, module, query, key, value, attention_mask, calls[0], kwargs)
    key_positions = rope.memo(("key positions", kv_len), lambda: _key_positions(positions, kv_len))
    dtype = query.dtype
    if single:
        call = calls[0]
        q_cos, q_sin = rope.tables(("q", 0), lambda: cos_sin(positions, call.inv_freq, call.scaling, dtype))
        k_cos, k_sin = rope.tables(("k", 0, kv_len), lambda: cos_sin(key_positions, call.inv_freq, call.scaling, dtype))
        return kernel(
            module, apply_rotary(query, q_cos, q_sin), apply_rotary(key, k_cos, k_sin), value, attention_mask, **kwargs
        )
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

    for index, call in enumerate(calls):
        keys = past + call.stop
        q_pos, k_pos = positions[:, call.start : call.stop], key_positions[:, :keys]
        q_cos, q_sin = rope.tables(("q", index), lambda: cos_sin(q_pos, call.inv_freq, call.scaling, dtype))
        k_cos, k_sin = rope.tables(("k", index, kv_len), lambda: cos_sin(k_pos, call.inv_freq, call.scaling, dtype))
        out, part = kernel(
            module,
            apply_rotary(query[:, :, call.start : call.stop], q_cos, q_sin),
            apply_rotary(key[:, :, :keys], k_cos, k_sin),
            value[:, :, :keys],
            _rows_mask(attention_mask, call.start, call.stop, keys, past, dtype, query.device),
            **kwargs,
        )
        merge(call.start, call.stop, call.rows, out, part)
    if rowwise is not None:
        batched = kwargs.get("dropout", 0.0) == 0.0 and not any(kwargs.get(k) is not None for k in _KERNEL_ONLY)
        attend = _attend_rowwise if batched else _attend_rowwise_by_kernel
        attend(rope, kernel, module, query, key, value, attention_mask, positions, key_positions, rowwise, merge,
               kwargs)
    return output, weights[0]


def grid_rotations(
    last: torch.Tensor, count: int, inv_freq: torch.Tensor, scaling: torch.Tensor | None
) -> torch.Tensor:
    """``scaling * exp(i * p * inv_freq)`` at the ``count`` positions ``p = last - count + 1 .. last``, complex64.

    A key rotation needs it for every key and frequency, and cos and sin of that many angles cost
    more than the rotation itself. Splitting ``p = last - a B - b`` with ``B`` about
    ``sqrt(count)`` and ``0 <= b < B``, it is the product of ``exp(i (last - a B) inv_freq)`` and
    ``exp(-i b inv_freq)``: cos/sin of about ``2 sqrt(count)`` angles per frequency, then one
    complex multiply per entry. That is one more rounding (~1e-7) than computing each angle
    directly, less than the rounding of the fp32 angles themselves at large positions. The entry
    at ``last`` is computed directly (``b = 0``, ``a = 0``), so offset 0 of a decoding step is
    exactly ``scaling``.

    Args:
        last: ``[batch or 1]`` integer position of the last entry, per batch row.
        count: number of positions.
        inv_freq: ``[batch or 1, *rows, rotary_dim // 2]`` fp32 frequencies (``rows``: none, or
            one dimension of query rows with their own frequencies).
        scaling: ``[batch or 1, *rows]`` fp32 multipliers, or ``None`` for 1.

    Returns:
        ``[batch, *rows, count, rotary_dim // 2]`` complex64.
    """
    fine = math.isqrt(max(count - 1, 0)) + 1  # B, with B * B >= count
    coarse = -(-count // fine)  # A, with A * B >= count
    device = inv_freq.device

    def unit(steps: torch.Tensor) -> torch.Tensor:  # exp(i * steps * inv_freq): [..., len(steps), half]
        angles = steps[..., None].float() * inv_freq[..., None, :]
        return torch.complex(angles.cos(), angles.sin())

    # a and b count down to 0, so that the flattened grid ascends to `last`
    rows = (1,) * (inv_freq.dim() - 2)
    coarse_steps = last.to(device).reshape(-1, *rows, 1) - torch.arange(coarse - 1, -1, -1, device=device) * fine
    coarse_part = unit(coarse_steps)  # [batch, *rows, A, half]
    fine_part = unit(torch.arange(1 - fine, 1, device=device))  # [batch or 1, *rows, B, half]
    if scaling is not None:
        fine_part = fine_part * scaling[..., None, None]
    table = (coarse_part[..., :, None, :] * fine_part[..., None, :, :]).flatten(-3, -2)  # [..., A * B, half]
    return table[..., coarse * fine - count :, :]


def _attend_decoding(
    rope: ExactDynamicRope,
    kernel: Any,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    call: _Call,
    kwargs: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One new token per row (a decoding step): the query stays un-rotated, each key turns by its offset.

    RoPE scores depend on the offset only: ``R(p theta) q . R(j theta) k = q . R((j - p) theta) k``,
    and YaRN's mscale scales both sides, so each key is rotated by ``(j - p) theta`` times
    ``mscale^2`` and the query is used as it is. The offsets of a row's keys are ``-(kv_len - 1) ..
    0`` whatever its positions (left padding included), so one table serves every row that shares
    frequencies and all layers. In fp32 the rotation is one complex multiply; the channel pairs
    ``(i, i + rotary_dim / 2)`` then come out interleaved, and the query's are interleaved alike
    (a dot product does not see the order). Other dtypes and devices rotate with :func:`_rotate`.
    """
    kv_len, half = key.shape[2], rope.rotary_dim // 2

    def rotation() -> torch.Tensor:  # [batch or 1, 1, kv_len, half] complex64, shared by the layers
        scaling = None if call.scaling is None else call.scaling.square()
        newest = torch.zeros(1, dtype=torch.long, device=call.inv_freq.device)  # offsets: the newest key is at 0
        return grid_rotations(newest, kv_len, call.inv_freq, scaling)[:, None]

    if not _complex_rotation(query):
        def real_tables() -> tuple[torch.Tensor, torch.Tensor]:
            table = rotation()
            return table.real.to(query.dtype), table.imag.to(query.dtype)

        cos, sin = rope.tables(("decode-real", kv_len, query.dtype), real_tables)
        return kernel(module, query, _rotate(key, cos, sin), value, attention_mask, **kwargs)
    (table,) = rope.tables(("decode", kv_len), lambda: (rotation(),))
    rotated = torch.complex(key[..., :half], key[..., half : 2 * half]).mul_(table)
    rotated_key, interleaved_query = torch.view_as_real(rotated).flatten(-2), _interleave(query, half)
    if 2 * half < key.shape[-1]:  # channels past rotary_dim are not rotated
        rotated_key = torch.cat((rotated_key, key[..., 2 * half :]), dim=-1)
        interleaved_query = torch.cat((interleaved_query, query[..., 2 * half :]), dim=-1)
    return kernel(module, interleaved_query, rotated_key, value, attention_mask, **kwargs)


def _query_tables(
    rope: ExactDynamicRope, query: torch.Tensor, positions: torch.Tensor, rowwise: _RowWise, start: int, stop: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[batch, rows, rotary_dim // 2]`` of rows ``[start, stop)``'s queries, each with its own frequencies."""
    inv_freq, scaling = rowwise.inv_freq[:, start:stop], rowwise.scaling[:, start:stop]

    def build():
        freqs = positions[:, start:stop, None].float() * inv_freq  # [batch, rows, rotary_dim // 2]
        scale = scaling[..., None]
        return (freqs.cos() * scale).to(query.dtype), (freqs.sin() * scale).to(query.dtype)

    return rope.tables(("q-row", start), build)


def _key_tables(
    rope: ExactDynamicRope,
    query: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: _RowWise,
    start: int,
    stop: int,
    keys: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[batch, rows, keys, rotary_dim // 2]`` in the query dtype: :func:`_key_rotations` as real tables."""

    def build():
        rotations = _key_rotation_table(rope, key_positions, rowwise, start, stop, keys)
        return rotations.real.to(query.dtype), rotations.imag.to(query.dtype)

    return rope.tables(("k-row", start, key_positions.shape[1], query.dtype), build)


def _interleave(x: torch.Tensor, half: int) -> torch.Tensor:
    """``x``'s rotary channels reordered as (0, half, 1, half + 1, ...): the real view of its complex pairs."""
    return torch.stack((x[..., :half], x[..., half : 2 * half]), dim=-1).flatten(-2)


def _key_rotations(
    rope: ExactDynamicRope, key_positions: torch.Tensor, rowwise: _RowWise, start: int, stop: int, keys: int
) -> torch.Tensor:
    """:func:`_key_rotation_table`, built once per forward and shared by the layers while it fits
    (:meth:`ExactDynamicRope.tables`)."""

    def build():
        return (_key_rotation_table(rope, key_positions, rowwise, start, stop, keys),)

    return rope.tables(("k-row-complex", start, key_positions.shape[1]), build)[0]


def _key_rotation_table(
    rope: ExactDynamicRope, key_positions: torch.Tensor, rowwise: _RowWise, start: int, stop: int, keys: int
) -> torch.Tensor:
    """Every row's rotation of the first ``keys`` keys as unit complex numbers times its multiplier.

    ``[batch, rows, keys, rotary_dim // 2]`` complex64 for query rows ``[start, stop)``. When every
    batch row's key positions run contiguously (no left padding, no gaps) it comes from
    :func:`grid_rotations`; otherwise each angle is computed directly.
    """
    inv_freq, scaling = rowwise.inv_freq[:, start:stop], rowwise.scaling[:, start:stop]
    contiguous = rope.memo(("contiguous keys", key_positions.shape[1]),
                           lambda: bool((key_positions.diff(dim=1) == 1).all()))
    if contiguous:
        return grid_rotations(key_positions[:, keys - 1], keys, inv_freq, scaling)
    freqs = key_positions[:, None, :keys, None].float() * inv_freq[:, :, None, :]  # [batch, rows, keys, half]
    table = freqs.new_empty(*freqs.shape, 2)
    torch.cos(freqs, out=table[..., 0])
    torch.sin(freqs, out=table[..., 1])
    return torch.view_as_complex(table.mul_(scaling[..., None, None, None]))


#: Kernel arguments the batched row-wise path does not implement (attention sinks, logit
#: soft-capping); with any of them set, or dropout, the rows go through the kernel instead.
_KERNEL_ONLY = ("s_aux", "softcap")


def _row_chunks(rowwise: _RowWise, key: torch.Tensor) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` row ranges whose per-row key copies stay within ``_ROWWISE_BUDGET`` elements."""
    chunk = max(1, _ROWWISE_BUDGET // max(1, key.numel()))
    for start in range(rowwise.start, rowwise.stop, chunk):
        yield start, min(start + chunk, rowwise.stop)


def _attend_rowwise(
    rope: ExactDynamicRope,
    kernel: Any,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: _RowWise,
    merge: Any,
    kwargs: dict[str, Any],
) -> None:
    """Attend rows that each need their own frequencies: a chunk of rows per batched matmul.

    The eager kernel's arithmetic (scores in the query dtype, mask added, softmax in fp32, cast
    back, times values), written out so that a chunk of rows is one computation: each row's keys
    are rotated with its frequencies (``[batch, rows, kv_heads, keys, head_dim]``), the grouped
    queries of a KV head multiply them in one batched matmul, and the probabilities of all rows
    share the un-copied values. Equal to :func:`_attend_rowwise_by_kernel` up to fp32 rounding;
    it does not call the kernel, whose batch-of-single-queries layout copies the keys again for
    every query head (eager's ``repeat_kv``) and the values for every row.
    """
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups, past = heads // kv_heads, kv_len - seq
    scaling = kwargs.get("scaling")
    scaling = dim**-0.5 if scaling is None else scaling
    half = rope.rotary_dim // 2
    # fp32: each channel pair (i, i + rotary_dim / 2) of a key is one complex number, so a row's
    # rotation of the keys is one complex multiply (the two products and the sum per output of
    # _rotate, in one pass instead of seven and a concatenation). Its real view interleaves the
    # pairs, so the queries are interleaved alike and the dot product is unchanged. Other dtypes
    # have no complex type that rounds like them and rotate with _rotate.
    pairs = None
    if _complex_rotation(query):
        pairs = torch.complex(key[..., :half], key[..., half : 2 * half])  # [batch, kv_heads, kv_len, half]
    for start, stop in _row_chunks(rowwise, key):
        rows, keys = stop - start, past + stop
        q = apply_rotary(query[:, :, start:stop], *_query_tables(rope, query, positions, rowwise, start, stop))
        q = q.view(batch, kv_heads, groups, rows, dim).permute(0, 3, 1, 2, 4)  # [batch, rows, kv_heads, groups, dim]
        if pairs is None:  # each row's own rotation of the keys, then one batched matmul with its queries
            k_cos, k_sin = _key_tables(rope, query, key_positions, rowwise, start, stop, keys)
            k = _rotate(key[:, None, :, :keys], k_cos[:, :, None], k_sin[:, :, None])  # [batch, rows, kv_heads, keys, d]
            scores = torch.matmul(q, k.transpose(-1, -2))
        else:
            rotations = _key_rotations(rope, key_positions, rowwise, start, stop, keys)  # [batch, rows, keys, half]
            rotated = pairs[:, None, :, :keys] * rotations[:, :, None]  # [batch, rows, kv_heads, keys, half]
            scores = torch.matmul(_interleave(q, half), torch.view_as_real(rotated).flatten(-2).transpose(-1, -2))
            if 2 * half < dim:  # channels past rotary_dim are not rotated
                scores = scores + torch.matmul(q[..., 2 * half :], key[:, None, :, :keys, 2 * half :].transpose(-1, -2))
        scores = scores * scaling  # [batch, rows, kv_heads, groups, keys]
        mask = _rows_mask(attention_mask, start, stop, keys, past, query.dtype, query.device)[:, 0, :, None, None]
        if mask.dtype == torch.bool:  # sdpa's boolean masks: True attends
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
        probs = probs.permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, rows * groups, keys)
        out = torch.matmul(probs, value[:, :, :keys])  # [batch, kv_heads, rows * groups, dim]
        out = out.view(batch, kv_heads, rows, groups, -1).permute(0, 2, 1, 3, 4).reshape(batch, rows, heads, -1)
        part = None
        if rope.kernel == "eager":  # eager returns its weights: [batch, heads, rows, keys]
            part = probs.view(batch, kv_heads, rows, groups, keys).transpose(2, 3).reshape(batch, heads, rows, keys)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)


def _attend_rowwise_by_kernel(
    rope: ExactDynamicRope,
    kernel: Any,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    rowwise: _RowWise,
    merge: Any,
    kwargs: dict[str, Any],
) -> None:
    """Attend rows that each need their own frequencies, a chunk of rows per kernel call.

    Each (batch, row) of a chunk becomes one single-query item of a ``batch * chunk`` kernel
    call, with its own copy of the keys rotated by its frequencies. The reference for
    :func:`_attend_rowwise`, and the path for what that does not implement (dropout, sinks,
    soft-capping).
    """
    batch, heads, seq, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    past = kv_len - seq
    for start, stop in _row_chunks(rowwise, key):
        rows, keys = stop - start, past + stop
        q = apply_rotary(query[:, :, start:stop], *_query_tables(rope, query, positions, rowwise, start, stop))
        k_cos, k_sin = _key_tables(rope, query, key_positions, rowwise, start, stop, keys)
        q = q.transpose(1, 2).reshape(batch * rows, heads, 1, dim)
        # every row's own rotation of the keys: [batch, rows, kv_heads, keys, dim]
        k = _rotate(key[:, None, :, :keys], k_cos[:, :, None], k_sin[:, :, None]).reshape(batch * rows, kv_heads, keys, dim)
        v = value[:, None, :, :keys].expand(batch, rows, kv_heads, keys, value.shape[-1])
        v = v.reshape(batch * rows, kv_heads, keys, value.shape[-1])
        mask = _rows_mask(attention_mask, start, stop, keys, past, query.dtype, query.device)
        mask = mask.expand(batch, -1, -1, -1).transpose(1, 2).reshape(batch * rows, mask.shape[1], 1, keys)
        out, part = kernel(module, q, k, v, mask, **kwargs)
        out = out.reshape(batch, rows, heads, out.shape[-1])
        if part is not None:
            part = part.reshape(batch, rows, part.shape[1], keys).transpose(1, 2)
        merge(start, stop, rowwise.rows[:, start:stop], out, part)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    # Llama/Mistral/Qwen attention modules: the ones that own k_proj and a layer index.
    return [m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m, "layer_idx")]


def _install(model: nn.Module) -> ExactDynamicRope | None:
    """Attach a new :class:`ExactDynamicRope` to ``model``'s attention and select the wrapper kernel.

    ``None`` (nothing done) when the config's rope type is not dynamic. The rotary modules are
    left to the caller.
    """
    config = model.config
    if (config.rope_parameters or {}).get("rope_type") not in EXACT_ROPE_TYPES:
        return None
    # A config that already names the wrapper (a model built from a patched model's config) wraps its kernel.
    kernel = (config._attn_implementation or "eager").removeprefix(ATTENTION_PREFIX)
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
    for module in attention:
        setattr(module, _STATE, rope)
    config._attn_implementation = rope.attention_name
    return rope


def enable_exact_dynamic_cache(model: nn.Module) -> None:
    """Make a model patched with ``dynamic_ntk`` / ``dynamic_yarn`` exact with a KV cache (see module docs).

    A no-op when the config's rope type is not dynamic (``factor=1`` patches plain RoPE).
    Called by :func:`hf_posext.patch_model` for ``exact_cache=True``.

    Raises:
        ValueError: an attention implementation other than ``eager``/``sdpa``, or no attention modules.
    """
    disable_exact_dynamic_cache(model)
    rope = _install(model)
    if rope is None:
        return
    for name, rotary in list(_compat.rotary_modules(model)):
        _compat.replace_module(model, name, ExactDynamicRotaryEmbedding(rotary, rope))
        _guard_cache(model.get_submodule(name.rpartition(".")[0]), rope)


def exact_rotary_at_init(base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
    """The stand-in a base model being built from a ``dynamic_*`` config with ``exact_cache=True`` registers.

    Called while the base model registers ``rotary`` in its ``__init__`` (``from_pretrained`` of a
    saved checkpoint), after its attention layers exist and transformers has resolved
    ``config._attn_implementation``: the exact wrapper of that kernel replaces it, so that
    ``attn_implementation="eager"`` or ``"sdpa"`` passed to ``from_pretrained`` selects the
    matching wrapper. ``None`` when the rope type is not dynamic.

    Raises:
        ValueError: as :func:`enable_exact_dynamic_cache`.
    """
    rope = _install(base_model)
    if rope is None:
        return None
    _guard_cache(base_model, rope)
    return ExactDynamicRotaryEmbedding(rotary, rope)


def _refuse_preallocated_cache(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of the base model: the wrapper needs the keys seen so far, not a preallocated buffer."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is not None and _compat.is_preallocated_cache(cache):
        raise ValueError(
            f"exact dynamic scaling (exact_cache=True) needs a cache that grows with the sequence (DynamicCache, "
            f"the default), got {type(cache).__name__}; generate with cache_implementation='dynamic', or patch with "
            f"exact_cache=False (transformers' behaviour, stale cached keys)"
        )


def _guard_cache(base_model: nn.Module, rope: ExactDynamicRope) -> None:
    """Refuse preallocated caches in ``base_model``'s forward; the hook goes with ``rope`` on disable."""
    rope.hooks.append(base_model.register_forward_pre_hook(_refuse_preallocated_cache, with_kwargs=True))


def disable_exact_dynamic_cache(model: nn.Module) -> None:
    """Undo :func:`enable_exact_dynamic_cache` (a no-op if it is not enabled)."""
    stand_ins = [(n, m) for n, m in model.named_modules() if isinstance(m, ExactDynamicRotaryEmbedding)]
    for name, module in stand_ins:
        _compat.replace_module(model, name, module.rotary)
    rope = None
    for module in model.modules():
        if _STATE in module.__dict__:
            rope = module.__dict__.pop(_STATE)
    if rope is None:
        return
    for hook in rope.hooks:
        hook.remove()
    if model.config._attn_implementation == rope.attention_name:
        model.config._attn_implementation = rope.kernel
