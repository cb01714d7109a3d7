"""LongRoPE's default cache: at the switch, the prefix is computed again with the factors of the new length.

transformers' ``longrope``, and every reader of the checkpoint, rotates all positions of a sequence
longer than L_orig with the long factors. A cache filled before the switch holds every layer's keys
and values computed with the short ones (a later layer's from the earlier layers' attention), so at
the first forward whose sequence passes L_orig (or, after a crop, is back within it) the prefix runs
through the model once more, into the same cache, with the factors of the length it continues to;
then the forward goes on. Each row is its own sequence (left padding as if alone). The prefix's
inputs, positions and attention mask travel with the cache (`Prefix`), through its crops,
beam reorders and batch selections. docs/methods/longrope.md.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

import torch
import torch.nn as nn

from ... import integration
from .rope import LongRopeRotaryEmbedding, forcing, last_long_rows, unwrap_rotary_modules, wrap_rotary_modules

#: The attribute of a cache holding its `Prefix`.
PREFIX_ATTR = "_hf_posext_longrope_prefix"
#: The attribute of a base model holding the hooks' handles.
HOOKS_ATTR = "_hf_posext_longrope_switch"
#: Segments kept apart before `Prefix.append` joins them (a decoding step adds one).
_SEGMENTS = 64

_thread = threading.local()  # recomputing: the switch's own forward runs; pending: what a forward's hook saw


class Prefix:
    """What a cache was computed from: per batch row the inputs, positions, attention mask and factor set.

    Args:
        batch: rows of the cache.
    """

    def __init__(self, batch: int) -> None:
        self.inputs: list[torch.Tensor] = []  # [batch, n] token ids or [batch, n, hidden] embeddings
        self.positions: list[torch.Tensor | int] = []  # [batch, n], or n: the default (counting on from the start)
        self.mask: torch.Tensor | None = None  # [batch, <= length] 2D attention mask; missing columns: attended
        self.mask_known = True  # False once a forward got a mask that is not 2D (a 4D one)
        self.long: tuple[bool, ...] = (False,) * batch  # per row: computed with the long factors
        self.length = 0  # tokens recorded

    def append(
        self, inputs: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None, long: tuple[bool, ...]
    ) -> None:
        """Add one forward's ``inputs`` (``[batch, n, ...]``), its ``positions`` ``[batch, n]`` (``None``: the
        default ones), its attention ``mask`` and the factor set of each row."""
        past, new = self.length, inputs.shape[1]
        self.inputs.append(inputs.detach().clone())
        self.positions.append(new if positions is None else positions.clone())
        self.length += new
        if mask is not None and mask.dim() == 2 and mask.shape[1] == past + new:
            self.mask = mask  # covers the prefix too (transformers' convention); the caller makes a new one per step
        elif mask is not None:
            self.mask_known = False
        self.long = long
        if len(self.inputs) > _SEGMENTS:
            self._join()

    def _join(self) -> None:
        """Join neighbouring segments of one kind (ids with ids, embeddings with embeddings)."""
        inputs: list[torch.Tensor] = []
        for segment in self.inputs:
            if inputs and inputs[-1].dim() == segment.dim():
                inputs[-1] = torch.cat((inputs[-1], segment), dim=1)
            else:
                inputs.append(segment)
        self.inputs = inputs
        if all(isinstance(p, int) for p in self.positions):
            self.positions = [self.length]
            return
        device, start, parts = self.inputs[0].device, 0, []
        for part in self.positions:
            width = part if isinstance(part, int) else part.shape[1]
            if isinstance(part, int):
                part = torch.arange(start, start + width, device=device).expand(len(self.long), -1)
            parts.append(part)
            start += width
        self.positions = [torch.cat(parts, dim=1)]

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens (a cache cropped back)."""
        self._join()
        kept, start = [], 0
        for segment in self.inputs:
            if start < length:
                kept.append(segment[:, : length - start])
            start += segment.shape[1]
        self.inputs, self.length = kept, min(self.length, length)
        positions = self.positions[0] if self.positions else 0
        self.positions = [self.length if isinstance(positions, int) else positions[:, :length]]
        if self.mask is not None:
            self.mask = self.mask[:, :length]

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self._rows(lambda t: t.index_select(0, beam_idx.to(t.device)), beam_idx.tolist())

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        rows = torch.arange(len(self.long))[indices.cpu()].tolist()
        self._rows(lambda t: t[indices.to(t.device)], rows)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(
            lambda t: t.repeat_interleave(repeats, dim=0), [i for i in range(len(self.long)) for _ in range(repeats)]
        )

    def _rows(self, change: Any, rows: list[int]) -> None:
        """Each tensor's batch rows through ``change``, which takes row ``rows[i]`` to row ``i``."""
        self._join()
        self.inputs = [change(s) for s in self.inputs]
        self.positions = [p if isinstance(p, int) else change(p) for p in self.positions]
        self.mask = None if self.mask is None else change(self.mask)
        self.long = tuple(self.long[i] for i in rows)

    def replay(self, base: nn.Module, length: int) -> dict[str, torch.Tensor | None]:
        """The keyword arguments of ``base``'s forward over the first ``length`` tokens: ``input_ids`` (or
        ``inputs_embeds`` where any forward was given embeddings), ``position_ids``, ``attention_mask``."""
        self.crop(length)
        if len(self.inputs) == 1 and self.inputs[0].dim() == 2:
            inputs = {"input_ids": self.inputs[0]}
        else:
            embed = base.get_input_embeddings()
            parts = [embed(s) if s.dim() == 2 else s for s in self.inputs]
            inputs = {"inputs_embeds": torch.cat([p.to(parts[-1].dtype) for p in parts], dim=1)}
        mask = self.mask
        if mask is not None and mask.shape[1] < length:  # forwards without a mask attended to all
            mask = torch.cat((mask, mask.new_ones(mask.shape[0], length - mask.shape[1])), dim=1)
        positions = self.positions[0]
        return {**inputs, "position_ids": None if isinstance(positions, int) else positions, "attention_mask": mask}


def recompute_prefix(base: nn.Module, cache: Any, length: int, prefix: Prefix, long: tuple[bool, ...]) -> None:
    """Fill ``cache`` anew with ``base``'s forward over the ``length`` tokens of ``prefix``, each row with the
    factors ``long`` says (the long ones where it holds).

    A ``DynamicCache`` keeps all its state in its layers: it is reset and filled in place (its layer kinds and
    offloading kept). Another class may keep more (MiniMax's linear-attention states beside its layers), so
    the model fills a cache of its own making, whose state then replaces the given cache's.

    Raises:
        ValueError: the model makes a cache of another class than the given one.
    """
    kwargs = prefix.replay(base, length)
    _thread.recomputing = True
    try:
        with forcing(torch.tensor(long, device=prefix.inputs[0].device)):
            if type(cache) is integration.DynamicCache:
                cache.reset()
                base(**kwargs, **{integration.cache_keyword(base): cache}, use_cache=True)
            else:
                fresh = _returned_cache(base(**kwargs, use_cache=True))
                if type(fresh) is not type(cache):
                    raise ValueError(
                        f"longrope: the switch computes the cache's prefix again, but {type(base).__name__} makes "
                        f"a {type(fresh).__name__}, not the {type(cache).__name__} it was given; pass a DynamicCache "
                        "or none, or patch with exact_cache=False (transformers' cache)"
                    )
                state = {key: value for key, value in vars(fresh).items() if key != PREFIX_ATTR}
                vars(cache).clear()
                vars(cache).update(state, **{PREFIX_ATTR: prefix})
    finally:
        _thread.recomputing = False
    prefix.long = long


def _arguments(base: nn.Module, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``base.forward``'s arguments by name (keyword arguments alone need no signature: a decoding step's)."""
    if not args:
        return kwargs
    try:
        return _signature(type(base)).bind_partial(base, *args, **kwargs).arguments
    except TypeError:  # the forward raises its own error
        return {}


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.forward)


def _before(
    original: int, rotaries: tuple[LongRopeRotaryEmbedding, ...], base: nn.Module, args: tuple, kwargs: dict[str, Any]
) -> None:
    """The base model's forward pre-hook (``original``: L_orig; ``rotaries``: its rotary modules): recompute the
    cache's prefix where a row crosses the switch."""
    _thread.pending = None
    if getattr(_thread, "recomputing", False):
        return
    given = _arguments(base, args, kwargs)
    inputs = given.get("input_ids")
    inputs = given.get("inputs_embeds") if inputs is None else inputs
    if not isinstance(inputs, torch.Tensor):
        return
    cache = given.get("cache", given.get("past_key_values"))
    batch, seq = inputs.shape[:2]
    past = int(cache.get_seq_length()) if cache is not None else 0
    positions = given.get("position_ids")  # None: the model counts on from the cache's length
    pinned = next((r.pinned for r in rotaries if r.pinned is not None), None)
    if pinned is not None:  # pinned_factors: one set whatever the positions
        long = (pinned,) * batch
        if positions is not None:
            positions = (positions[0] if positions.dim() == 3 else positions).expand(batch, -1)
    elif positions is None:
        long = (past + seq > original,) * batch
    else:
        positions = (positions[0] if positions.dim() == 3 else positions).expand(batch, -1)  # 3D: the text section
        long = tuple((positions.amax(dim=-1) + 1 > original).tolist())
    mask = given.get("attention_mask")
    if past:
        prefix = _prefix_of(cache, past, batch)
        if prefix.long != long:
            if not prefix.mask_known:
                raise ValueError(
                    "longrope: the cache's prefix must be computed again for the switch at "
                    f"L_orig={original}, but a forward got an attention mask that is not 2D [batch, keys]; "
                    "pass 2D masks, or patch with exact_cache=False (transformers' cache)"
                )
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] == past + seq:
                prefix.mask = mask[:, :past]
            recompute_prefix(base, cache, past, prefix, long)
    _thread.pending = (inputs, positions, mask, long, past)


def _prefix_of(cache: Any, past: int, batch: int) -> Prefix:
    """The `Prefix` of a cache holding ``past`` tokens of ``batch`` rows, cut to them (a crop)."""
    prefix = getattr(cache, PREFIX_ATTR, None)
    if prefix is None or prefix.length < past or len(prefix.long) != batch:
        held = "no record" if prefix is None else f"a record of {prefix.length} tokens in {len(prefix.long)} rows"
        raise ValueError(
            f"longrope: this {type(cache).__name__} holds {past} tokens in {batch} rows but {held} of what computed "
            "them (a cache this model did not fill, or one changed outside transformers' Cache methods), so its "
            "prefix cannot be computed again at the switch; pass a cache this model filled, or patch with "
            "exact_cache=False (transformers' cache)"
        )
    if prefix.length > past:
        prefix.crop(past)
    return prefix


def _after(base: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    """The base model's forward hook: record the forward's inputs with the cache it returns."""
    pending, _thread.pending = getattr(_thread, "pending", None), None
    if pending is None or getattr(_thread, "recomputing", False):
        return
    inputs, positions, mask, long, past = pending
    used, pinned = last_long_rows()
    rows = None if used is None else used.tolist()
    rows = None if rows is None else tuple(rows * len(long) if len(rows) == 1 else rows)
    if pinned and rows is not None:  # pinned_factors chose the set: the cache holds what it chose
        long = rows
    elif rows is not None and rows != long:
        raise RuntimeError(
            f"longrope: {type(base).__name__} rotated with positions other than its position_ids (or "
            "past + arange when none are given); the switch's cache cannot follow it: patch with exact_cache=False"
        )
    cache = _returned_cache(output)
    if cache is None:
        return
    prefix = getattr(cache, PREFIX_ATTR, None) if past else None
    if prefix is None:
        prefix = Prefix(inputs.shape[0])
        setattr(cache, PREFIX_ATTR, prefix)
        integration.follow_cache_batch_changes(PREFIX_ATTR)
    prefix.append(inputs, positions, mask, long)


def _returned_cache(output: Any) -> Any | None:
    if isinstance(output, dict):  # a ModelOutput: transformers >= 5.24 names it cache, before past_key_values
        cache = output.get(
            "cache" if "cache" in getattr(type(output), "__dataclass_fields__", ()) else "past_key_values"
        )
    else:
        cache = next((item for item in output if hasattr(item, "get_seq_length")), None)
    return cache if hasattr(cache, "get_seq_length") and hasattr(cache, "reset") else None


def install(base: nn.Module, rotaries: tuple[LongRopeRotaryEmbedding, ...]) -> None:
    """The switch's hooks on ``base``, the module holding the rotary modules ``rotaries`` (whose ``pinned`` set,
    `pinned.pinned_factors`, the hooks follow); once: a second call replaces them.

    Raises:
        ValueError: ``base``'s forward takes no ``input_ids`` and cache (the prefix could not be run again).
    """
    uninstall(base)
    parameters = inspect.signature(base.forward).parameters
    if "input_ids" not in parameters or not {"cache", "past_key_values"} & set(parameters):
        raise ValueError(
            f"longrope's cache: {type(base).__name__} holds the rotary module but its forward takes no input_ids "
            "and cache, so the prefix cannot be run again at the switch; patch with exact_cache=False"
        )
    original = int(base.config.rope_parameters["original_max_position_embeddings"])
    base.__dict__[HOOKS_ATTR] = (  # a partial of a module function: the model still deep-copies and pickles
        base.register_forward_pre_hook(functools.partial(_before, original, rotaries), with_kwargs=True),
        base.register_forward_hook(_after, with_kwargs=True),
    )


def uninstall(base: nn.Module) -> None:
    """Undo `install` (nothing to do if it is not installed)."""
    for handle in base.__dict__.pop(HOOKS_ATTR, ()):
        handle.remove()


def enable(model: nn.Module) -> None:
    """Per-row rotary modules and the switch's hooks on every module holding one (``patch_model``)."""
    bases = {id(m): m for m in _holders(model)}
    wrap_rotary_modules(model, per_row=True)
    for base in bases.values():
        install(base, tuple(m for m in base.modules() if isinstance(m, LongRopeRotaryEmbedding)))


def disable(model: nn.Module) -> None:
    """Undo `enable` (a no-op where it is not enabled)."""
    for module in model.modules():
        uninstall(module)
    unwrap_rotary_modules(model)


def enabled(model: nn.Module) -> bool:
    """Whether ``model`` has the switch's rotary modules and hooks."""
    return any(isinstance(m, LongRopeRotaryEmbedding) and m.per_row for m in model.modules()) and any(
        HOOKS_ATTR in m.__dict__ for m in model.modules()
    )


def _holders(model: nn.Module) -> list[nn.Module]:
    names = [name for name, _ in integration.rotary_modules(model)]
    return [model.get_submodule(name.rpartition(".")[0]) if "." in name else model for name in names]
