"""The transformers integration boundary: everything that touches transformers' internals, in one place.

hf-posext plugs into transformers 5.x through its documented extension points:

* ``modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]``, read by every rotary module in its ``__init__`` (again by
  ``@dynamic_rope_update`` for the dynamic types; for ``longrope`` it picks ``original_inv_freq`` or ``long_inv_freq``);
* ``RotaryEmbeddingConfigMixin._validate_<rope_type>_rope_parameters``, looked up by name when a
  config is validated (transformers only *warns* for a type it has no validator for);
* ``AttentionInterface`` / ``AttentionMaskInterface`` and ``PreTrainedModel._from_config`` (wrapped to copy a config
  the construction hook would patch), reached when transformers imports them (`post_import`);
* rotary modules that are rebuilt from the patched config with ``type(module)(config=config)``;
* ``config._attn_implementation``, ``masking_utils``' mask builders (ALiBi's masks), the private
  field hook of ``HfArgumentParser`` (`FieldArgumentParser`), ``HfArg``, ``bytes_to_unicode``.
``import hf_posext`` loads no ``modeling_utils`` / ``masking_utils``; elsewhere the package imports only
transformers' public top-level names (tests/test_package_structure.py). Internal: not part of the public API.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn
from transformers import HfArgumentParser, modeling_rope_utils
from transformers.hf_argparser import HfArg
from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

from .post_import import forget, when_imported

#: transformers' helpers that its top level does not export, and ``DynamicCache`` (whose module
#: ``import hf_posext`` must not load: tests/test_import_cost.py), re-exported for the package from the
#: module that defines them, imported when first asked for (`__getattr__`).
_LAZY = {
    "add_offsets_to_mask_function": "transformers.masking_utils",
    "and_masks": "transformers.masking_utils",
    "causal_mask_function": "transformers.masking_utils",
    "flash_attention_mask": "transformers.masking_utils",
    "padding_mask_function": "transformers.masking_utils",
    "prepare_padding_mask": "transformers.masking_utils",
    "sdpa_mask": "transformers.masking_utils",
    "bytes_to_unicode": "transformers.convert_slow_tokenizer",
    "DynamicCache": "transformers.cache_utils",
}

__all__ = ["HfArg", *_LAZY]


def __getattr__(name: str) -> Any:
    """A name of `_LAZY`, imported from its transformers module when first asked for."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


RopeInitFn = Callable[..., Any]
Validator = Callable[[Any, dict[str, Any], "set[str] | None"], None]

MODELING_UTILS = "transformers.modeling_utils"
MASKING_UTILS = "transformers.masking_utils"
#: The attention names the package registers start so; transformers' own kernels never do.
OWN_ATTENTION_PREFIX = "hf_posext"


def check_rope_type_free(rope_type: str, init_fn: RopeInitFn) -> None:
    """Refuse ``rope_type`` when transformers (or another plugin) holds it with another function.

    Raises:
        ValueError: naming the rope type and the module that holds it.
    """
    existing = modeling_rope_utils.ROPE_INIT_FUNCTIONS.get(rope_type)
    if existing is not None and existing is not init_fn:
        raise ValueError(f"rope_type {rope_type!r} is already registered by {existing.__module__}")


def check_attention_free(name: str, attention_fn: Callable[..., Any]) -> None:
    """Refuse an attention name transformers (or another plugin) holds with another function ("eager" included).

    Raises:
        ValueError: naming the attention implementation.
    """
    if name != "eager" and MODELING_UTILS not in sys.modules and name.startswith(OWN_ATTENTION_PREFIX):
        return  # no registry yet, so nothing but transformers' own kernels, none of them so named, could hold it
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    existing = ALL_ATTENTION_FUNCTIONS.get(name)
    if name == "eager" or (existing is not None and existing is not attention_fn):
        holder = "transformers" if name == "eager" else getattr(existing, "__module__", "another package")
        raise ValueError(f"attention {name!r} is already registered by {holder}")


def copy_config_in_from_config(copy_when: Callable[[Any], bool]) -> Callable[[], None]:
    """Make ``from_config`` build from a deep copy of a config for which ``copy_when(config)`` holds.

    transformers 5.24 builds the model on the caller's config object itself; a construction hook that
    patches the config while the model is built (Qwen's ``dual_chunk_attention_config`` adopted as
    DCA) would otherwise change the caller's config. Done when transformers imports ``modeling_utils``
    (now if it has). Returns the undo.
    """
    wrapped: list[tuple[type, Any]] = []

    def wrap(modeling_utils: ModuleType) -> None:
        model_class = modeling_utils.PreTrainedModel
        original = model_class.__dict__["_from_config"]
        build = original.__func__

        @functools.wraps(build)
        def _from_config(cls: type, config: Any, **kwargs: Any) -> Any:
            return build(cls, copy.deepcopy(config) if copy_when(config) else config, **kwargs)

        model_class._from_config = classmethod(_from_config)
        wrapped.append((model_class, original))

    when_imported(MODELING_UTILS, wrap)

    def undo() -> None:
        forget(MODELING_UTILS, wrap)
        for model_class, original in wrapped:
            model_class._from_config = original
        wrapped.clear()

    return undo


def register_rope_type(rope_type: str, init_fn: RopeInitFn, validate: Validator) -> None:
    """Make ``rope_type`` loadable by every transformers model with a rotary embedding.

    Args:
        rope_type: the name written to ``config.rope_parameters["rope_type"]``.
        init_fn: ``fn(config, device=None, seq_len=None, layer_type=None) -> (inv_freq, attention_factor)``.
        validate: ``validate(config, rope_parameters, ignore_keys)``, called when a config is validated.
            transformers' contract (its own types'): a missing required key raises ``KeyError``, an
            unknown one is warned about ([`check_received_keys`][hf_posext.check_received_keys]), a bad value
            raises ``ValueError``.
    """
    check_rope_type_free(rope_type, init_fn)
    modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type] = init_fn

    def validator(self, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None) -> None:
        validate(self, rope_parameters, ignore_keys)

    setattr(RotaryEmbeddingConfigMixin, f"_validate_{rope_type}_rope_parameters", validator)


#: Keys hf-posext writes into transformers' own ``longrope`` entries for other readers (vLLM and SGLang read
#: ``short_mscale`` / ``long_mscale``, not ``attention_factor``: `hf_posext.rope_utils.longrope_rope_parameters`).
LONGROPE_READER_KEYS = frozenset({"short_mscale", "long_mscale"})


def accept_longrope_reader_keys() -> None:
    """Make transformers' ``longrope`` validator accept `LONGROPE_READER_KEYS` without a warning.

    transformers warns "Unrecognized keys" for them each time such a config is built (eight times for one
    demo row); after ``import hf_posext`` the plugin's own keys are known. Idempotent; other unknown keys
    still warn.
    """
    original = getattr(RotaryEmbeddingConfigMixin, "_validate_longrope_rope_parameters", None)
    if original is None or getattr(original, "_hf_posext_reader_keys", False):
        return

    @functools.wraps(original)
    def validator(self, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None) -> None:
        original(self, rope_parameters, ignore_keys=set(ignore_keys or ()) | LONGROPE_READER_KEYS)

    validator._hf_posext_reader_keys = True  # type: ignore[attr-defined]
    RotaryEmbeddingConfigMixin._validate_longrope_rope_parameters = validator  # type: ignore[method-assign]


def check_received_keys(
    config: Any, rope_parameters: dict[str, Any], required: set[str], optional: set[str], ignore_keys: set[str] | None
) -> None:
    """transformers' own key check of a rope entry: ``KeyError`` for a missing required key, a warning naming
    each unknown one (``partial_rotary_factor`` is always allowed)."""
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type"))
    config._check_received_keys(rope_type, set(rope_parameters), set(required), set(optional), ignore_keys=ignore_keys)


def is_registered_rope_type(rope_type: str) -> bool:
    return rope_type == "default" or rope_type in modeling_rope_utils.ROPE_INIT_FUNCTIONS


def rotary_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every rotary embedding that reads the config's rope type."""
    for name, module in model.named_modules():
        if hasattr(module, "rope_type") and hasattr(module, "config") and _frequency_buffer(module) is not None:
            yield name, module


def _frequency_buffer(module: nn.Module) -> Any:
    """``inv_freq``, or with per-layer-type rope parameters (Gemma 3) the first ``<layer type>_inv_freq``."""
    if isinstance(module.rope_type, dict):
        return next((getattr(module, f"{key}_inv_freq", None) for key in module.rope_type), None)
    return getattr(module, "inv_freq", None)


def rotary_device(module: nn.Module) -> Any:
    """The device of a rotary module's frequencies."""
    return _frequency_buffer(module).device


def replace_module(model: nn.Module, qualified_name: str, new: nn.Module) -> None:
    parent_name, _, child = qualified_name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def rebuild_rotary(module: nn.Module) -> nn.Module:
    """A fresh rotary module of the same class built from ``module.config`` (patched by then).

    The new ``inv_freq`` stays in fp32 on the old module's device whatever the model dtype.
    """
    new = type(module)(config=module.config)
    return new.to(device=rotary_device(module))


def restore_scaling_on_reset(rotary: nn.Module) -> None:
    """Make transformers' dynamic reset restore ``attention_scaling`` along with ``inv_freq``.

    ``@dynamic_rope_update`` sets both when a sequence grows past the longest seen, but when a
    sequence shorter than the original context follows, it puts back only ``inv_freq``: a dynamic
    YaRN model would keep the grown mscale on plain-RoPE frequencies. A forward pre-hook, run
    before that update on the same state, restores the scaling the module was built with in
    exactly that case. No effect on dynamic NTK, whose scaling is always 1.
    """
    if not hasattr(rotary, "attention_scaling"):  # per-layer-type modules: no dynamic YaRN (patching refuses it)
        return
    initial = rotary.attention_scaling

    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if module.max_seq_len_cached <= module.original_max_seq_len:  # nothing grown: no reset coming
            return
        position_ids = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
        if int(position_ids.max()) + 1 < module.original_max_seq_len:  # transformers' reset condition
            module.attention_scaling = initial

    rotary.register_forward_pre_hook(hook, with_kwargs=True)


@functools.cache
def _static_forward(cls: type) -> Callable[..., Any] | None:
    """A rotary module class's forward inside ``@dynamic_rope_update`` (found by the code object of the function
    that decorator wraps with), or ``None`` when it has none."""
    code = modeling_rope_utils.dynamic_rope_update(lambda module, x, position_ids: None).__code__
    function = cls.forward
    while function is not None and getattr(function, "__code__", None) is not code:
        function = getattr(function, "__wrapped__", None)
    return None if function is None else function.__wrapped__


def rotary_tables(rotary: nn.Module, x: Any, position_ids: Any) -> Any:
    """What ``rotary(x, position_ids)`` returns with the frequencies it holds now: the forward without
    ``@dynamic_rope_update``, which would pick ``longrope``'s set from the largest position (the rest of the
    forward, gradients off, is the module's own)."""
    forward = _static_forward(type(rotary))
    if forward is None:  # no dynamic update to step around
        return rotary(x, position_ids)
    with torch.no_grad():
        return forward(rotary, x, position_ids)


@contextlib.contextmanager
def longrope_frequencies_pinned(rotary: nn.Module, inv_freq: torch.Tensor) -> Iterator[None]:
    """transformers' ``longrope`` rotary module rotating with ``inv_freq`` at every length within the block.

    Its ``@dynamic_rope_update`` copies ``long_inv_freq`` (past L_orig) or ``original_inv_freq`` into
    ``inv_freq`` at every forward: both are ``inv_freq`` within, and put back after.
    """
    saved_short, saved_long = rotary.original_inv_freq, rotary.__dict__.get("long_inv_freq")
    rotary.original_inv_freq, rotary.long_inv_freq = inv_freq, inv_freq
    try:
        yield
    finally:
        rotary.original_inv_freq = saved_short
        if saved_long is None:
            del rotary.long_inv_freq  # transformers computes it at the next forward past L_orig
        else:
            rotary.long_inv_freq = saved_long


def rope_init_function(rope_type: str) -> RopeInitFn:
    """transformers' ``(config, device, seq_len, layer_type) -> (inv_freq, attention_factor)`` for ``rope_type``."""
    return modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]


def preallocated_cache(forward_kwargs: dict[str, Any]) -> Any | None:
    """The cache a model forward was given if it hands attention preallocated key buffers (``StaticCache``'s
    layers) rather than the keys so far, else ``None``; transformers 5.24 names it ``cache`` (``past_key_values``
    before)."""
    from transformers.cache_utils import StaticLayer

    cache = forward_kwargs.get("cache", forward_kwargs.get("past_key_values"))
    return cache if any(isinstance(layer, StaticLayer) for layer in getattr(cache, "layers", ())) else None


def _refuse_preallocated_cache(
    needs: str, alternative: str, module: nn.Module, args: tuple, kwargs: dict[str, Any]
) -> None:
    cache = preallocated_cache(kwargs)
    if cache is not None:
        raise ValueError(
            f"{needs} needs a cache that grows with the sequence (DynamicCache, the default), got "
            f"{type(cache).__name__}; generate with cache_implementation='dynamic'{alternative}"
        )


def guard_growing_cache(base_model: nn.Module, needs: str, alternative: str = "") -> Any:
    """Refuse a preallocated cache in ``base_model``'s forward (a pre-hook; its handle is returned).

    For attention that needs the keys seen so far: the message says ``needs`` needs a cache that
    grows with the sequence and how to generate with one, then ``alternative``. The hook is a
    partial of a module function, so the model still deep-copies and pickles.
    """
    hook = functools.partial(_refuse_preallocated_cache, needs, alternative)
    return base_model.register_forward_pre_hook(hook, with_kwargs=True)


def cache_keyword(module: nn.Module) -> str:
    """The keyword ``module``'s forward takes a cache by: ``cache`` (transformers >= 5.24) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


#: The ``Cache`` methods that change its batch rows, which `follow_cache_batch_changes` extends.
CACHE_BATCH_METHODS = ("reorder_cache", "batch_select_indices", "batch_repeat_interleave")
#: The attributes whose objects follow those methods (`follow_cache_batch_changes`).
_CACHE_FOLLOWERS: list[str] = []


def follow_cache_batch_changes(attr: str) -> None:
    """Make transformers' ``Cache`` methods that change its batch rows (`CACHE_BATCH_METHODS`) call the
    same-named method of the object a cache holds as ``attr``, with the same arguments, after their own work.

    For state kept beside a cache that must move with its rows (beam search reorders them). Wrapping the base
    class once, when first asked, keeps every cache, its deep copies and pickles plain transformers objects; a
    cache without ``attr`` is untouched. A subclass that overrides a method without calling ``Cache``'s is not
    followed.
    """
    if attr in _CACHE_FOLLOWERS:
        return
    _CACHE_FOLLOWERS.append(attr)
    if len(_CACHE_FOLLOWERS) > 1:  # already wrapped
        return
    from transformers.cache_utils import Cache

    for name in CACHE_BATCH_METHODS:
        setattr(Cache, name, _following(getattr(Cache, name), name))


def _following(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        for attr in _CACHE_FOLLOWERS:
            follower = getattr(self, attr, None)
            if follower is not None:
                getattr(follower, name)(*args, **kwargs)
        return result

    return method


def register_attention(name: str, attention_fn: Callable[..., Any], mask_fn: Callable[..., Any] | str) -> None:
    """Register ``attention_fn`` and its mask function as ``config._attn_implementation = name``.

    transformers builds no causal mask at all for an attention name without a mask function, so
    the two are always registered together. ``mask_fn`` is the mask function or the name of the
    kernel masked alike (``"sdpa"``...). Both take effect when transformers' ``modeling_utils`` /
    ``masking_utils`` are imported (now if they already are).

    Raises:
        ValueError: ``name`` is held by transformers or another plugin (`check_attention_free`).
    """
    check_attention_free(name, attention_fn)
    _register_attention(name, attention_fn, mask_fn)


def _register_attention(name: str, attention_fn: Callable[..., Any], mask_fn: Callable[..., Any] | str) -> None:
    def register_forward(modeling_utils: ModuleType) -> None:
        modeling_utils.AttentionInterface.register(name, attention_fn)

    def register_mask(masking_utils: ModuleType) -> None:
        mask = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS[mask_fn] if isinstance(mask_fn, str) else mask_fn
        masking_utils.AttentionMaskInterface.register(name, mask)

    when_imported(MODELING_UTILS, register_forward)
    when_imported(MASKING_UTILS, register_mask)


def register_attention_wrapper(name: str, attention_fn: Callable[..., Any], mask_like: str) -> None:
    """Register ``attention_fn`` as ``config._attn_implementation = name``, masked like ``mask_like``.

    Without an ``AttentionMaskInterface`` entry transformers silently builds no causal mask at all.
    """
    _register_attention(name, attention_fn, mask_like)


def remove_attention_state(model: nn.Module, attr: str) -> Any | None:
    """Undo an attention wrapper's install: pop the state each attention module holds under ``attr``.

    The state (``hooks``, ``attention_name``, ``kernel``) loses its forward hooks, and
    ``config._attn_implementation`` goes back to the kernel it wrapped. None when nothing was installed.
    """
    state = None
    for module in model.modules():
        if attr in module.__dict__:
            state = module.__dict__.pop(attr)
    if state is None:
        return None
    for hook in state.hooks:
        hook.remove()
    if attention_implementation(model.config) == state.attention_name:
        set_attention_implementation(model.config, state.kernel)
    return state


def attention_implementation(config: Any) -> str | None:
    """``config._attn_implementation``: the attention a model built from ``config`` runs (``None`` until resolved)."""
    return getattr(config, "_attn_implementation", None)


def set_attention_implementation(config: Any, name: str | None) -> None:
    """Make the model of ``config`` run the attention registered as ``name`` from its next forward.

    transformers 5.24 keeps it in the private ``_attn_implementation`` (a property that also sets it
    on sub-configs); it is never saved: a saved config carries ``attn_implementation`` instead.
    """
    config._attn_implementation = name


def attention_function(implementation: str, module: nn.Module) -> Callable[..., Any]:
    """The attention function ``module`` would call for ``config._attn_implementation = implementation``.

    ``"eager"`` is not in transformers' registry: each model file defines its own ``eager_attention_forward``.
    """
    if implementation == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[implementation]


def set_saved_attribute(config: Any, name: str, value: Any) -> None:
    """Make ``config.save_pretrained`` write ``name: value`` at the top of config.json; ``None`` removes it.

    ``PreTrainedConfig.to_dict`` serializes the instance ``__dict__``; ``rope_scaling`` is a
    property aliasing ``rope_parameters`` in transformers 5, so only ``__dict__`` can hold it
    (reading ``config.rope_scaling`` still gives ``rope_parameters``).
    """
    if value is None:
        config.__dict__.pop(name, None)
    else:
        config.__dict__[name] = value


class FieldArgumentParser(HfArgumentParser):
    """``HfArgumentParser`` whose flag building per dataclass field can be extended by a public method.

    transformers 5.24 builds each field's flag in the private static ``_parse_dataclass_field``;
    a subclass overrides `add_field` instead, and calls `add_default_field` for the
    flag HfArgumentParser would build.
    """

    def add_field(self, parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        """Add the flag(s) of ``field`` to ``parser`` (a group of this parser); default: HfArgumentParser's."""
        self.add_default_field(parser, field)

    @staticmethod
    def add_default_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        HfArgumentParser._parse_dataclass_field(parser, field)

    def _parse_dataclass_field(self, parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:  # type: ignore[override]
        self.add_field(parser, field)  # transformers calls it as self._parse_dataclass_field per field
