"""Adapters: patch a transformers model (or its config) in place with a position method.

With :mod:`hf_posext.adapters` (one adapter per method family that needs more than rope
parameters) this is the only code that performs model surgery. A patch

1. records what the checkpoint had (:class:`~hf_posext.methods.base.BaseRope`) in
   ``config.hf_posext``, so that re-patching starts again from the original and never stacks,
   and :func:`unpatch_model` restores it;
2. writes the method's ``rope_parameters`` and advertised context into the config;
3. rebuilds every rotary module from the patched config (transformers reads the rope type in
   the rotary module's ``__init__``), keeping the original modules for :func:`unpatch_model`;
4. lets the method's adapter (:mod:`hf_posext.adapters`) do any further surgery.

The forward code of the model is never replaced, so future model classes that keep
transformers' rotary contract keep working.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import torch.nn as nn
from transformers import PreTrainedConfig

from . import _compat, architectures
from .adapters import adapter_for
from .architectures import SUPPORTED_MODEL_TYPES
from .methods.base import BaseRope, PositionMethod, make_method, method_class
from .rope_utils import rotary_dim_of

__all__ = ["CONFIG_KEY", "SUPPORTED_MODEL_TYPES", "MethodName", "patch_info", "patch_model", "unpatch_model"]

#: The config attribute holding what a patch did; saved in config.json with the checkpoint.
CONFIG_KEY = "hf_posext"

_ORIGINAL_MODULES = "_hf_posext_original_modules"

#: Every registered method name and alias, for type checkers; tests/test_patching.py checks that it
#: equals the registry (available_methods() plus method_aliases()).
MethodName = Literal[
    "linear", "pi", "ntk", "ntk_aware", "dynamic_ntk", "dynamic", "yarn", "dynamic_yarn", "alibi", "sinusoidal",
    "learned",
]
ModelOrConfig = TypeVar("ModelOrConfig", nn.Module, PreTrainedConfig)


def _config_of(model: nn.Module | PreTrainedConfig) -> PreTrainedConfig:
    if isinstance(model, PreTrainedConfig):
        return model
    config = getattr(model, "config", None)
    if not isinstance(config, PreTrainedConfig):
        raise TypeError(
            f"expected a transformers model or config, got {type(model).__name__} without a PreTrainedConfig"
        )
    return config


def _base_rope(config: PreTrainedConfig, method: PositionMethod, override: bool, layer_type: str | None = None) -> BaseRope:
    """What the checkpoint had before hf-posext, with ``L_orig`` resolved for ``method``.

    Args:
        layer_type: the entry of per-layer-type rope parameters to read; ``None`` for a flat config.
    """
    record = getattr(config, CONFIG_KEY, None)
    if record is not None:
        rope_parameters = copy.deepcopy(_entry(record["base_rope_parameters"], layer_type))
        max_positions = int(record["base_max_position_embeddings"])
        original = int(record["base_original_max_position_embeddings"])
    else:
        current = dict(_entry(config.rope_parameters or {}, layer_type))
        rope_type = current.get("rope_type", current.get("type", "default"))
        max_positions = int(config.max_position_embeddings)
        original = int(
            current.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", None)
            or max_positions
        )
        if rope_type != "default" and not override:
            raise ValueError(
                f"this checkpoint already uses rope_type={rope_type!r} ({current}); hf-posext extends plain-RoPE "
                f"checkpoints. Pass override=True to replace its scaling with {method.name!r} on top of plain RoPE "
                f"with rope_theta={current.get('rope_theta')} and original context {original}."
            )
        rope_parameters = {"rope_type": "default", "rope_theta": current.get("rope_theta", config.default_theta)}
        if "partial_rotary_factor" in current:
            rope_parameters["partial_rotary_factor"] = current["partial_rotary_factor"]
    if method.original_max_position_embeddings is not None:
        original = method.original_max_position_embeddings
    return BaseRope(
        rope_parameters=rope_parameters,
        max_position_embeddings=max_positions,
        original_max_position_embeddings=original,
        rotary_dim=rotary_dim_of(config, rope_parameters),
    )


def _entry(rope_parameters: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    return rope_parameters if layer_type is None else rope_parameters[layer_type]


def _method_rope(method: PositionMethod, base: BaseRope) -> tuple[dict[str, Any], int]:
    """The rope parameters and advertised context of ``method`` on ``base``."""
    if method.factor == 1 and method.scales_rope:
        return dict(base.rope_parameters), base.max_position_embeddings
    return method.rope_parameters(base), method.max_position_embeddings(base)


def _patch_config(
    config: PreTrainedConfig, method: PositionMethod, override: bool, layer_types: Sequence[str] | None = None
) -> None:
    architectures.check_config(config)
    keys = architectures.rope_layer_types(config, layer_types, method.scales_rope)
    if not keys:
        base = _base_rope(config, method, override)
        rope_parameters, max_positions = _method_rope(method, base)
        base_parameters = base.rope_parameters
    else:
        # Per-layer-type rope parameters (Gemma 3): the chosen layer types get the method, the
        # others keep the checkpoint's entry; the record keeps the whole nested dict for unpatch.
        record = getattr(config, CONFIG_KEY, None)
        base_parameters = copy.deepcopy(record["base_rope_parameters"] if record else config.rope_parameters)
        rope_parameters = copy.deepcopy(base_parameters)
        for key in keys:
            base = _base_rope(config, method, override, layer_type=key)
            rope_parameters[key], max_positions = _method_rope(method, base)
    config.rope_parameters = rope_parameters
    config.max_position_embeddings = max_positions
    setattr(
        config,
        CONFIG_KEY,
        {
            **method.to_dict(),
            "original_max_position_embeddings": base.original_max_position_embeddings,
            "context_length": (
                int(round(method.factor * base.original_max_position_embeddings)) if method.scales_rope else max_positions
            ),
            "base_rope_parameters": base_parameters,
            "base_max_position_embeddings": base.max_position_embeddings,
            "base_original_max_position_embeddings": base.original_max_position_embeddings,
            **({"layer_types": keys} if keys else {}),
        },
    )
    adapter_for(method).patch_config(method, config)
    try:
        config.validate_rope()
    except (ValueError, TypeError) as error:  # e.g. Phi3Config accepts only rope_type default or longrope
        raise ValueError(
            f"model_type {config.model_type!r} does not accept the rope parameters {method.name!r} needs "
            f"({rope_parameters}): {error}"
        ) from error


def _swap_rotary_modules(model: nn.Module, keep_originals: bool) -> None:
    """Rebuild rotary modules from the (patched) config.

    Args:
        keep_originals: the current modules are the checkpoint's own (the model was not patched
            before), so keep them for :func:`unpatch_model` to put back bit for bit.
    """
    originals = model.__dict__.setdefault(_ORIGINAL_MODULES, {})
    found = False
    for name, module in list(_compat.rotary_modules(model)):
        found = True
        if keep_originals:
            originals.setdefault(name, module)
        _compat.replace_module(model, name, _compat.rebuild_rotary(module))
    if not found:
        raise ValueError(f"{type(model).__name__} has no rotary embedding module that hf-posext can patch")


def patch_model(
    model: ModelOrConfig,
    method: MethodName | str | PositionMethod,
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    *,
    override: bool = False,
    layer_types: Sequence[str] | None = None,
    **kwargs: Any,
) -> ModelOrConfig:
    """Patch ``model`` in place with a position-encoding method and return it.

    Patching again replaces the previous patch: every patch starts from the checkpoint's own
    rope parameters, recorded in ``config.hf_posext``.

    Args:
        model: a decoder whose rotary embedding follows transformers' rope_parameters contract
            (:mod:`hf_posext.architectures`; tested on :data:`SUPPORTED_MODEL_TYPES`), or its config.
        method: a name from :func:`available_methods` or a method config object.
        factor: the context scale s >= 1; ``None`` keeps the config object's (or the default 1).
        original_max_position_embeddings: the pretraining context; default: the checkpoint's.
        override: replace a scaling the checkpoint already ships (``llama3``, ``yarn``...).
        layer_types: with per-layer-type rope parameters (Gemma 3), the layer types to patch;
            default: all but the local ones (sliding window), whose short range needs no extension.
        **kwargs: the method's own arguments, e.g. ``beta_fast`` for YaRN.

    Returns:
        The same object, patched.

    Raises:
        ValueError: an unknown method or argument, a bad value, an unsupported architecture,
            or a checkpoint with its own rope scaling when ``override`` is False.

    Example:
        >>> model = hf_posext.patch_model(model, "yarn", factor=4)   # 4k -> 16k
    """
    if factor is not None:
        kwargs["factor"] = factor
    if original_max_position_embeddings is not None:
        kwargs["original_max_position_embeddings"] = original_max_position_embeddings
    config = _config_of(model)
    spec = make_method(method, **kwargs)
    architectures.check_config(config)
    if isinstance(model, nn.Module):
        architectures.check_rotary_modules(model)
    _check_method_fits(config, spec, model if isinstance(model, nn.Module) else None)
    # A dry run on a copy: a config class that refuses the method's rope type (Phi-3 accepts only
    # default and longrope) fails here, before the model is touched.
    _patch_config(copy.deepcopy(config), spec, override, layer_types)
    previous_record = getattr(config, CONFIG_KEY, None)
    if previous_record is not None:
        # A re-patch starts from the checkpoint: undo what the previous method did beyond rope
        # parameters (ALiBi's attention implementation, absolute encodings' position table).
        previous = method_from_record(previous_record)
        adapter_for(previous).unpatch_config(previous, config, previous_record)
        if isinstance(model, nn.Module):
            adapter_for(previous).unpatch_modules(previous, model)
    _patch_config(config, spec, override, layer_types)
    if isinstance(model, nn.Module):
        _swap_rotary_modules(model, keep_originals=previous_record is None)
        adapter_for(spec).patch_modules(spec, model)
    return model


def _check_method_fits(config: PreTrainedConfig, method: PositionMethod, model: nn.Module | None) -> None:
    """Refuse dynamic methods where their rotary update would be wrong (before anything is changed)."""
    if not method.dynamic:
        return
    nested = architectures.nested_rope_keys(config)
    if nested and method.name == "dynamic_yarn":
        # transformers' dynamic update stores YaRN's attention scaling on the module, not per layer type
        raise ValueError(
            f"dynamic_yarn does not support per-layer-type rope parameters (model_type={config.model_type!r}, layer "
            f"types {nested}); use yarn or dynamic_ntk"
        )
    if getattr(method, "exact_cache", False):
        architectures.check_exact_dynamic(config, model)


def method_from_record(record: dict[str, Any]) -> PositionMethod:
    """The method config a ``config.hf_posext`` record was written by."""
    fields = {f.name for f in dataclasses.fields(method_class(record["method"]))}
    return make_method(record["method"], **{k: v for k, v in record.items() if k in fields})


def unpatch_model(model: ModelOrConfig) -> ModelOrConfig:
    """Undo :func:`patch_model`: the checkpoint's own rope parameters and rotary modules come back.

    Raises:
        ValueError: if ``model`` carries no hf-posext patch.
    """
    config = _config_of(model)
    record = getattr(config, CONFIG_KEY, None)
    if record is None:
        raise ValueError(f"{type(model).__name__} carries no hf-posext patch to undo")
    spec = method_from_record(record)
    adapter = adapter_for(spec)
    config.rope_parameters = copy.deepcopy(record["base_rope_parameters"])
    config.max_position_embeddings = int(record["base_max_position_embeddings"])
    adapter.unpatch_config(spec, config, record)
    delattr(config, CONFIG_KEY)
    if isinstance(model, nn.Module):
        adapter.unpatch_modules(spec, model)
        originals = model.__dict__.pop(_ORIGINAL_MODULES, {})
        for name, module in list(_compat.rotary_modules(model)):
            original = originals.get(name)
            restored = original.to(device=_compat.rotary_device(module)) if original is not None else None
            _compat.replace_module(model, name, restored or _compat.rebuild_rotary(module))
    return model


def patch_info(model: nn.Module | PreTrainedConfig) -> dict[str, Any]:
    """What position encoding ``model`` carries.

    Returns:
        ``{"method": name or None, "rope_parameters": ..., "max_position_embeddings": ...}`` plus,
        for a patched model, the method's arguments, ``original_max_position_embeddings`` and
        the ``context_length`` the patch reaches.
    """
    config = _config_of(model)
    record = copy.deepcopy(getattr(config, CONFIG_KEY, None) or {})
    info: dict[str, Any] = {"method": record.pop("method", None)}
    info.update({k: v for k, v in record.items() if not k.startswith("base_")})
    info["rope_parameters"] = copy.deepcopy(config.rope_parameters)
    info["max_position_embeddings"] = config.max_position_embeddings
    return info
