"""The per-forward plan of exact dynamic attention, and the per-model frequencies it is built from.

`ExactDynamicRope` is one per patched model and holds nothing that changes within a
forward: the config, the frequencies for each length (a bounded, locked cache) and the wrapped
kernel. Everything a forward computes once and shares between its layers (the split of the query
rows into kernel calls, rotation tables) lives on a `ForwardPlan`, which
`ExactDynamicRope.plan` finds by the ``position_ids`` tensor that transformers hands every
layer's attention function. Two forwards running at once (threads, ``nn.DataParallel``
replicas sharing the modules) have different ``position_ids`` tensors and so different plans.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ... import integration
from ...rope_utils import LONGROPE_ROPE_TYPES, rotary_dim_of
from ..maps import attention_maps_requested, kernel_function
from .frequencies import frequency_rows
from .kept import KeptPositions
from .rotation import cos_sin, multipliers

#: ``config._attn_implementation`` while exact dynamic scaling is on is this prefix plus the kernel.
ATTENTION_PREFIX = "hf_posext_exact_dynamic_"
#: The attribute of each attention module that holds the model's `ExactDynamicRope`.
STATE_ATTR = "_hf_posext_exact_dynamic"
#: The attribute of a cache layer saying how it stores its keys: ``(count, length)``, the first ``count``
#: tokens from the sequence's start rotated with the frequencies of ``length`` (one of
#: `ExactDynamicRope.stable`), the later ones un-rotated; absent: none rotated.
ROTATED_ATTR = "_hf_posext_rotated_keys"

#: Elements of rotated-key copies the row-wise path may build at once on the CPU, and of cos/sin
#: tables a forward may keep for its layers (beyond that they are recomputed per layer). On the
#: CPU small chunks are faster, not only leaner: they stay in cache
#: (docs/notes/exact_dynamic.md).
ROWWISE_BUDGET = 1 << 21
TABLE_BUDGET = 1 << 25
#: The row-wise budget on a GPU (or any non-CPU device), where each chunk's dozens of kernel
#: launches, not the cache, set the cost: with the CPU's budget a 4k-token prompt on an H200 went
#: one row per chunk and took 1800x transformers' dynamic prefill (docs/results/gpu.md).
#: 2^27 elements are 256 MiB of bf16 keys per chunk.
ACCELERATOR_ROWWISE_BUDGET = 1 << 27
#: Mask elements (``[rows, keys]``) of one kernel call for rows sharing one frequency set: a longer
#: run of rows goes to the kernel in blocks (`attention.call_blocks`). 2^24 are 64 MiB of
#: fp32 mask; off the CPU, where each call's launches cost more, 2^27.
CALL_MASK_BUDGET = 1 << 24
ACCELERATOR_CALL_MASK_BUDGET = 1 << 27
#: Scratch buffers up to this many fp32 elements' worth are kept between forwards, one set per
#: thread (`ForwardPlan.scratch`); bigger ones live as long as their forward.
SCRATCH_KEPT = 1 << 23
#: Plans kept alive at once per model: one per forward in flight, plus slack.
_MAX_PLANS = 8
#: Frequency sets kept per model: decoding asks for a new length per step.
_MAX_FREQUENCIES = 64
#: Lengths computed together when decoding asks for one that is not kept: the next steps' too.
_FREQUENCIES_AHEAD = 32


class Scratch:
    """Flat buffers for temporaries, by name, reused instead of allocated anew (see `ForwardPlan.scratch`)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat ``[numel]`` view of the buffer ``name``; a buffer that is too small is replaced by one a
        quarter bigger than asked, so that a decoding step's one more key does not reallocate it each step."""
        key = (name, dtype, str(device))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel + numel // 4, dtype=dtype, device=device)
            self._buffers[key] = buffer
        return buffer[:numel]


@dataclass
class Call:
    """One kernel call: query rows ``[start, stop)`` rotated with one frequency set per batch row."""

    start: int
    stop: int
    inv_freq: torch.Tensor  # [batch or 1, rotary_dim // 2], fp32
    scaling: torch.Tensor | None  # [batch or 1], fp32; None when every multiplier is 1
    rows: torch.Tensor | None  # [batch, stop - start] bool: the rows this call answers for; None = all
    kept: torch.Tensor | None = None  # [batch or 1] bool: rows with kept positions (KeptPositions.rows)


@dataclass
class RowWise:
    """Query rows that each need their own frequencies (lengths between L_orig and saturation).

    They are attended in chunks, every (batch, row) as its own single-query problem, so that a
    prompt past L_orig costs a few kernel calls rather than one per row.
    """

    start: int
    stop: int
    inv_freq: torch.Tensor  # [batch, seq, rotary_dim // 2], fp32: each row's own frequencies
    scaling: torch.Tensor  # [batch, seq], fp32
    rows: torch.Tensor  # [batch, seq] bool: the rows this path answers for


class ForwardPlan:
    """What one forward's layers share: its query positions, kernel calls and rotation tables.

    Attributes:
        rope: the model's `ExactDynamicRope`.
        positions: ``[batch, seq]`` query positions (a copy: the plan never keeps the caller's tensor alive).
        calls: multi-row kernel calls, each with one frequency set per batch row.
        rowwise: the rows that each need their own frequencies, or ``None``.
    """

    def __init__(self, rope: ExactDynamicRope, positions: torch.Tensor) -> None:
        self.rope = rope
        self.positions = positions
        self.calls: list[Call] = []
        self.rowwise: RowWise | None = None
        self.stable_length = rope.stable_length(positions)  # ExactDynamicRope.stable: all queries share it, or None
        self.rotated_layers: set[int] = set()  # cache layers this forward rotated (DiffLlama attends twice)
        self._tables: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self._table_elements = 0
        self._memo: dict[tuple, Any] = {}
        self._scratch: dict[int, Scratch] = {}
        self._lock = threading.Lock()
        self._split(positions)

    def _split(self, positions: torch.Tensor) -> None:
        rope, device, seq = self.rope, positions.device, positions.shape[1]
        lengths = rope.frequency_length(positions + 1)
        if seq == 1 or bool((lengths == lengths[:, :1]).all()):
            # One frequency set per row (decoding, or a prompt within one regime): one kernel call.
            row_lengths = lengths[:, 0].tolist()
            if len(set(row_lengths)) == 1:  # rows of one length (no padding, beams) share one frequency set
                row_lengths = row_lengths[:1]
            per_row = [rope.frequencies(length, device) for length in row_lengths]
            inv_freq = torch.stack([f for f, _ in per_row])
            self.calls = [
                Call(
                    0,
                    seq,
                    inv_freq,
                    multipliers([s for _, s in per_row], device),
                    None,
                    rope.kept.rows(row_lengths, rope.saturation, device),
                )
            ]
            return
        # Lengths up to L_orig (and, for YaRN, from saturation on) share one frequency set: one
        # multi-row kernel call each. Every length in between belongs to a single position.
        shared = torch.zeros_like(lengths, dtype=torch.bool)
        for length in (rope.original, rope.saturation):
            rows = lengths == length
            touched = rows.any(dim=0).nonzero().flatten().tolist() if length is not None else []
            if not touched:
                continue
            start, stop = touched[0], touched[-1] + 1
            inv_freq, scaling = rope.frequencies(length, device)
            self.calls.append(
                Call(
                    start,
                    stop,
                    inv_freq[None],
                    multipliers([scaling], device),
                    rows[:, start:stop],
                    rope.kept.rows([length], rope.saturation, device),
                )
            )
            shared |= rows
        own = ~shared
        touched = own.any(dim=0).nonzero().flatten().tolist()
        if touched:
            distinct, index = torch.unique(lengths, return_inverse=True)
            table, scales = rope.frequency_table(distinct.tolist(), device)
            inv_freq = table[index]
            scaling = torch.tensor(scales, dtype=torch.float32, device=device)[index]
            self.rowwise = RowWise(touched[0], touched[-1] + 1, inv_freq, scaling, own)

    @property
    def single(self) -> bool:
        """Whether the whole forward is one kernel call with one frequency set per batch row."""
        return self.rowwise is None and len(self.calls) == 1 and self.calls[0].rows is None

    def memo(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()``, once per forward (for small per-forward values shared by the layers)."""
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        value = build()
        with self._lock:
            return self._memo.setdefault(key, value)

    def scratch(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat ``[numel]`` buffer ``name`` for temporaries of this thread, reused by the layers.

        A large fresh tensor costs one page fault per 4 KiB each time it is allocated (the
        allocator maps it anew, and this adds up to more than the arithmetic on it): the row-wise
        path's per-row key copies and a decoding step's rotated keys are written into the same
        memory by every layer and chunk instead. Buffers up to ``SCRATCH_KEPT`` elements are kept
        by the model's `ExactDynamicRope` for the next forwards of the thread; bigger ones
        are dropped with the plan. The contents are overwritten by the next caller.
        """
        device = self.positions.device
        if numel * dtype.itemsize <= 4 * SCRATCH_KEPT:
            return self.rope.scratch().get(name, numel, dtype, device)
        with self._lock:
            scratch = self._scratch.setdefault(threading.get_ident(), Scratch())
        return scratch.get(name, numel, dtype, device)

    def tables(self, key: tuple, build: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """Rotation tables (cos/sin, or complex) under ``key``, built once per forward and shared by the layers.

        Past ``TABLE_BUDGET`` fp32 elements' worth a forward stops keeping them (a long prompt's
        row-wise tables would not fit) and they are rebuilt per layer.
        """
        with self._lock:
            if key in self._tables:
                return self._tables[key]
        built = build()
        size = sum(t.numel() * t.element_size() for t in built) // 4
        with self._lock:
            if key in self._tables:
                return self._tables[key]
            if self._table_elements + size <= TABLE_BUDGET:
                self._tables[key] = built
                self._table_elements += size
        return built


class ExactDynamicRope:
    """Frequencies of a dynamic rope type as a function of the length, and the plans of the forwards in flight.

    One instance per patched model, shared by its attention modules.

    Args:
        config: the patched model config (``rope_type`` in `frequencies.EXACT_ROPE_TYPES`).
        kernel: the attention implementation the wrapper delegates to.
    """

    def __init__(self, config: Any, kernel: str) -> None:
        params = config.rope_parameters
        self.config = config
        self.rope_type = params["rope_type"]
        self.kernel = kernel
        self.attention_name = ATTENTION_PREFIX + kernel
        self.rotary_dim = rotary_dim_of(config)
        self._init_fn = integration.rope_init_function(self.rope_type)
        if self.rope_type == "dynamic":
            # transformers' dynamic NTK reads L_orig from max_position_embeddings and never stops growing
            self.original = int(config.max_position_embeddings)
            self.saturation: int | None = None
        elif self.rope_type in LONGROPE_ROPE_TYPES:
            # short factors up to L_orig tokens, long ones from L_orig + 1 on: one switch, two frequency sets
            self.original = int(params["original_max_position_embeddings"])
            self.saturation = self.original + 1
        else:
            self.original = int(params["original_max_position_embeddings"])
            # s(L) = min(factor, L / L_orig) stops changing at the first L with L / L_orig >= factor
            self.saturation = math.ceil(float(params["factor"]) * self.original)
        # The frequency lengths whose keys the cache keeps rotated (forwards whose queries all have one of them
        # rotate only their new keys): past saturation; for LongRoPE also up to L_orig, whose short factors hold
        # until the switch. The dynamic types' frequencies change at every length between L_orig and
        # saturation, which needs un-rotated keys: keys rotated up to L_orig would be un-rotated there.
        if self.saturation is None:
            self.stable: tuple[int, ...] = ()
        elif self.rope_type in LONGROPE_ROPE_TYPES:
            self.stable = (self.original, self.saturation)
        else:
            self.stable = (self.saturation,)
        self.kept = KeptPositions(params, self.rotary_dim)  # LongRoPE's keep_first (none for the other types)
        self.pinned: int | None = None  # every query's frequency length while set (longrope's pinned_factors)
        self.hooks: list[Any] = []  # removable handles of the base model's cache guard
        self.warned_rowwise_on_accelerator = False  # the row-wise prefill's speed warning, once per model
        self._init_caches()

    def _init_caches(self) -> None:
        """The lock and what is only a cache (frequencies, plans, kernels, scratch buffers): never copied."""
        self._lock = threading.Lock()
        self._frequencies: OrderedDict[tuple[int, str], tuple[torch.Tensor, float]] = OrderedDict()
        self._plans: OrderedDict[tuple, tuple[weakref.ref, ForwardPlan]] = OrderedDict()
        self._kernels: dict[type, Any] = {}
        self._scratch = threading.local()
        self._forward = threading.local()  # the cache this thread's forward was given (weakly)

    def __getstate__(self) -> dict[str, Any]:
        # copy.deepcopy, pickle and torch.save(model) copy what defines the model; a lock, weak
        # references and thread-local buffers cannot be copied and a copy fills its own caches.
        caches = {"_lock", "_frequencies", "_plans", "_kernels", "_scratch", "_forward"}
        return {key: value for key, value in self.__dict__.items() if key not in caches}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_caches()

    def frequency_length(self, lengths: torch.Tensor) -> torch.Tensor:
        """The smallest length with the same frequencies as each of ``lengths`` (same shape); `pinned` if set."""
        if self.pinned is not None:
            return torch.full_like(lengths, self.pinned)
        return lengths.clamp(min=self.original, max=self.saturation)

    def frequencies(self, length: int, device: torch.device | str) -> tuple[torch.Tensor, float]:
        """``(inv_freq [rotary_dim // 2] fp32, cos/sin multiplier)`` for a sequence of ``length`` tokens."""
        key = (int(length), str(device))
        with self._lock:
            if key in self._frequencies:
                return self._frequencies[key]
        # a decoding step asks for one more length than the last: one batched computation serves the next ones too
        ahead = [int(length) + k for k in range(_FREQUENCIES_AHEAD)]
        rows = frequency_rows(self.config, self.rope_type, ahead, device)
        if rows is None:
            inv_freq, scaling = self._init_fn(self.config, device, seq_len=int(length))
            computed = {key: (inv_freq.to(device=device, dtype=torch.float32), float(scaling))}
        else:
            computed = {(k, str(device)): (f, m) for k, f, m in zip(ahead, rows[0], rows[1], strict=True)}
        with self._lock:
            self._frequencies.update(computed)
            while len(self._frequencies) > _MAX_FREQUENCIES:  # keep the recent ones
                self._frequencies.popitem(last=False)
        return computed[key]

    def frequency_table(self, lengths: list[int], device: torch.device | str) -> tuple[torch.Tensor, list[float]]:
        """``(inv_freq [len(lengths), rotary_dim // 2] fp32, multipliers)``: `frequencies` of each length,
        computed together where `frequencies.frequency_rows` handles the rope type."""
        rows = frequency_rows(self.config, self.rope_type, [int(length) for length in lengths], device)
        if rows is not None:
            return rows
        per_length = [self.frequencies(length, device) for length in lengths]
        return torch.stack([f for f, _ in per_length]), [s for _, s in per_length]

    def plan(self, position_ids: torch.Tensor, batch: int) -> ForwardPlan:
        """The plan of the forward whose layers receive ``position_ids`` ``[batch or 1, seq]``.

        Built by the first layer that asks and shared by the others. It is found again by the
        tensor's identity and version (an in-place change of the tensor makes a new plan), checked
        through a weak reference, so a freed tensor whose id is reused never finds a stale plan.
        """
        # inference tensors have no version counter (and cannot be changed in place outside inference mode)
        version = None if position_ids.is_inference() else position_ids._version
        key = (id(position_ids), version, batch, str(position_ids.device), self.pinned)
        with self._lock:
            found = self._plans.get(key)
            if found is not None and found[0]() is position_ids:
                return found[1]
        plan = ForwardPlan(self, position_ids.expand(batch, -1).clone())
        with self._lock:
            found = self._plans.get(key)
            if found is not None and found[0]() is position_ids:
                return found[1]  # another thread planned the same forward first
            # forwards that have finished (their position_ids freed) drop their tables here
            for stale in [k for k, (ref, _) in self._plans.items() if ref() is None]:
                del self._plans[stale]
            self._plans[key] = (weakref.ref(position_ids), plan)
            while len(self._plans) > _MAX_PLANS:
                self._plans.popitem(last=False)
        return plan

    def note_cache(self, cache: Any) -> None:
        """Remember (weakly) the cache this thread's forward was given, for `cache_layer`."""
        self._forward.native = None  # until this forward's rotary module finds it native (mark_native)
        try:
            self._forward.cache = weakref.ref(cache) if cache is not None else None
        except TypeError:  # an object without weak references: no rotated keys for it
            self._forward.cache = None

    def cache_layer(self, module: nn.Module, key: torch.Tensor) -> Any | None:
        """The cache layer of ``module`` whose key tensor is ``key`` (the keys attention was handed are the
        cache's own, so rotating them in place rotates the cache), or ``None`` (no cache, another kind)."""
        ref = getattr(self._forward, "cache", None)
        cache = ref() if ref is not None else None
        layers, index = getattr(cache, "layers", None), getattr(module, "layer_idx", None)
        if layers is None or not isinstance(index, int) or not 0 <= index < len(layers):
            return None
        layer, keys = layers[index], getattr(layers[index], "keys", None)
        if keys is key:
            return layer
        # a sliding-window layer keeps a view of the last keys it hands attention: the same memory
        kept = keys.shape[-2] if isinstance(keys, torch.Tensor) and keys.dim() == key.dim() else 0
        if (
            0 < kept <= key.shape[-2]
            and keys.stride() == key.stride()
            and keys.data_ptr() == key[..., key.shape[-2] - kept :, :].data_ptr()
            and callable(getattr(layer, "get_seq_length", None))
        ):
            return layer
        return None

    def stable_length(self, positions: torch.Tensor) -> int | None:
        """The stable length (`stable`) every query at ``positions`` (``[batch or 1, seq]``) has, if they
        share one, else ``None``."""
        if not self.stable or not positions.numel():
            return None
        first, last = self.frequency_length(torch.stack(torch.aminmax(positions)) + 1).tolist()
        return first if first == last and first in self.stable else None

    def mark_native(self, position_ids: torch.Tensor) -> int | None:
        """For the forward at ``position_ids`` ``[batch or 1, seq]`` (this thread's, from its rotary module): the
        stable length every query has when the cache it was given stores every key rotated with its frequencies,
        else ``None``. Then the model can rotate as a static one does, and `native_length` tells its layers."""
        self._forward.native = None
        ref = getattr(self._forward, "cache", None)
        layers = getattr(ref() if ref is not None else None, "layers", None)
        if not layers or not self.stable:
            return None
        states = set()
        for layer in layers:
            if not callable(getattr(layer, "get_seq_length", None)):
                return None
            count, length = getattr(layer, ROTATED_ATTR, None) or (0, None)
            if not count or count != layer.get_seq_length():
                return None
            states.add(length)
        if len(states) != 1 or self.stable_length(position_ids) not in states:
            return None
        length = states.pop()
        self._forward.native = (weakref.ref(position_ids), length)
        return length

    def native_length(self, position_ids: torch.Tensor) -> int | None:
        """The stable length `mark_native` found for the forward at ``position_ids`` (that tensor), or None."""
        native = getattr(self._forward, "native", None)
        return native[1] if native is not None and native[0]() is position_ids else None

    def cos_sin(self, call: Call, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Half tables ``[batch, seq, rotary_dim // 2]`` of ``positions`` with ``call``'s frequencies, LongRoPE's
        kept positions on plain RoPE in its rows past the switch (`kept.KeptPositions`)."""
        cos, sin = cos_sin(positions, call.inv_freq, call.scaling, dtype)
        return (cos, sin) if call.kept is None else self.kept.swap(positions, call.kept, cos, sin, dtype)

    def stable_cos_sin(
        self, length: int, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Half tables ``[batch, seq, rotary_dim // 2]`` of ``positions`` with the frequencies of the stable
        ``length`` (`stable`), the kept positions on plain RoPE past saturation: `cos_sin` of a call
        of that length, for keys the cache stores rotated."""
        device = positions.device
        inv_freq, scaling = self.frequencies(length, device)
        cos, sin = cos_sin(positions, inv_freq[None], multipliers([scaling], device), dtype)
        kept = self.kept.rows([length], self.saturation, device)
        return (cos, sin) if kept is None else self.kept.swap(positions, kept, cos, sin, dtype)

    def rotary_tables(
        self, length: int, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' rotary output at the stable ``length``: ``(cos, sin)`` ``[batch, seq, rotary_dim]`` times the
        multiplier (past saturation LongRoPE's kept positions, `kept`, with plain RoPE and multiplier 1)."""
        inv_freq, scaling = self.frequencies(length, positions.device)
        freqs = positions[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * scaling, emb.sin() * scaling
        if self.kept and length == self.saturation:
            cos, sin = self.kept.swap_full(positions, cos, sin)
        return cos.to(dtype), sin.to(dtype)

    def scratch(self) -> Scratch:
        """This thread's `Scratch` kept between forwards (`ForwardPlan.scratch`)."""
        scratch = getattr(self._scratch, "buffers", None)
        if scratch is None:
            scratch = self._scratch.buffers = Scratch()
        return scratch

    def kernel_for(self, module: nn.Module, kwargs: dict[str, Any]) -> Any:
        """The wrapped kernel's attention function for ``module`` (once per class); eager's where maps are asked."""
        if self.kernel != "eager" and attention_maps_requested(module, kwargs):
            return kernel_function(self.kernel, module, kwargs)
        kind = type(module)
        kernel = self._kernels.get(kind)
        if kernel is None:
            kernel = self._kernels.setdefault(kind, integration.attention_function(self.kernel, module))
        return kernel
