"""``patch_model`` / ``unpatch_model`` / ``patch_info``: patch a transformers model (or its config) in place.

A patch records what the checkpoint had in ``config.hf_posext`` (so patches never stack and
[`unpatch_model`][hf_posext.unpatch_model] restores it), writes the method's ``rope_parameters`` and advertised context,
rebuilds every rotary module from the patched config, and lets the method's surgery
([`Surgery`][hf_posext.Surgery]) do the rest. The model's forward code is never
replaced, so model classes that keep transformers' rotary contract keep working.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import torch.nn as nn
from transformers import PreTrainedConfig

from .. import architectures, integration, readers
from ..methods.base import BaseRope, MethodConfig
from ..methods.registry import available_methods, method_class, method_config, surgery_for
from ..validation.saved_model import check_rope_config
from ..validation.unknown_method import refuse_to_build, unknown_method
from .shipped_rope import CONFIG_KEY, base_rope, shipped_rope
from .transaction import Snapshot, restore, snapshot

_ORIGINAL_MODULES = "_hf_posext_original_modules"

#: Every registered method name and alias, for type checkers only (``str`` is accepted too);
#: tests/patching/test_patching.py checks that it equals the registry (available_methods() plus method_aliases()).
MethodName = Literal[
    "linear",
    "pi",
    "ntk",
    "ntk_aware",
    "dynamic_ntk",
    "dynamic",
    "yarn",
    "dynamic_yarn",
    "alibi",
    "sinusoidal",
    "learned",
    "self_extend",
    "dca",
    "string",
    "rerope",
    "longrope",
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


def _method_rope(method: MethodConfig, base: BaseRope) -> tuple[dict[str, Any], int]:
    """The rope parameters and advertised context of ``method`` on ``base``."""
    method.context_length(base)  # refuses a context beyond MAX_CONTEXT, before the method's own checks
    method.check_base(base)
    if method.factor == 1 and method.scales_rope:
        return dict(base.rope_parameters), base.max_position_embeddings
    if base.pair_divisors is not None:
        return method.composed_rope_parameters(base), method.max_position_embeddings(base)
    return method.rope_parameters(base), method.max_position_embeddings(base)


def _patch_config(
    config: PreTrainedConfig, method: MethodConfig, override: bool, layer_types: Sequence[str] | None = None
) -> None:
    """Write ``method`` into ``config`` (checked by `architectures.check_config`, any previous patch undone)."""
    keys = architectures.rope_layer_types(config, layer_types, method.scales_rope)
    # The record keeps what the checkpoint itself had, whatever this patch replaces (override=True
    # included), so that unpatch restores it and a later patch starts from it.
    base_parameters, _, checkpoint_reach = shipped_rope(config, keys[-1] if keys else None)
    if not keys:
        base = base_rope(config, method, override)
        rope_parameters, max_positions = _method_rope(method, base)
    else:
        # Per-layer-type rope parameters (Gemma 3): the chosen layer types get the method, the
        # others keep the checkpoint's entry; the record keeps the whole nested dict for unpatch.
        record = getattr(config, CONFIG_KEY, None)
        base_parameters = copy.deepcopy(record["base_rope_parameters"] if record else config.rope_parameters)
        rope_parameters = copy.deepcopy(base_parameters)
        for key in keys:
            base = base_rope(config, method, override, layer_type=key)
            rope_parameters[key], max_positions = _method_rope(method, base)
    previous = getattr(config, CONFIG_KEY, None)
    # What the checkpoint itself had in the fields the readers' rules overwrite (some configs carry a
    # top-level rope_theta of their own), for unpatch to put back.
    reader_fields = (
        previous["base_reader_fields"]
        if previous and "base_reader_fields" in previous
        else readers.saved_fields(config)
    )
    config.rope_parameters = rope_parameters
    config.max_position_embeddings = max_positions
    setattr(
        config,
        CONFIG_KEY,
        {
            **method.to_dict(),
            "original_max_position_embeddings": base.original_max_position_embeddings,
            "context_length": method.context_length(base) if method.scales_rope else max_positions,
            "base_rope_parameters": base_parameters,
            "base_max_position_embeddings": base.max_position_embeddings,
            "base_original_max_position_embeddings": checkpoint_reach,
            "base_reader_fields": reader_fields,
            **({"composed_on": base.rope_type} if base.pair_divisors is not None else {}),
            **({"layer_types": keys} if keys else {}),
        },
    )
    surgery_for(method).patch_config(method, config)
    try:
        config.validate_rope()
    except (ValueError, TypeError, KeyError) as error:  # e.g. Phi3Config accepts only rope_type default or longrope
        raise ValueError(
            f"model_type {config.model_type!r} does not accept the rope parameters {method.name!r} needs "
            f"({rope_parameters}): {error}"
        ) from error
    try:  # transformers only warns for some (a negative factor, a rope type nobody registered): a plugin's rope
        check_rope_config(config)
    except ValueError as error:
        raise ValueError(f"method {method.name!r} writes rope parameters no reader can build: {error}") from None
    readers.write_reader_fields(config)  # transformers 4.x and the engines read these (hf_posext.readers)


def _swap_rotary_modules(model: nn.Module, keep_originals: bool) -> None:
    """Rebuild rotary modules from the (patched) config.

    Args:
        keep_originals: the current modules are the checkpoint's own (the model was not patched
            before), so keep them for [`unpatch_model`][hf_posext.unpatch_model] to put back bit for bit.
    """
    originals = model.__dict__.setdefault(_ORIGINAL_MODULES, {})
    found = False
    for name, module in list(integration.rotary_modules(model)):
        found = True
        if keep_originals:
            originals.setdefault(name, module)
        integration.replace_module(model, name, integration.rebuild_rotary(module))
    if not found:
        raise ValueError(f"{type(model).__name__} has no rotary embedding module that hf-posext can patch")


def patch_model(
    model: ModelOrConfig,
    method: MethodName | str | MethodConfig,
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    *,
    override: bool = False,
    layer_types: Sequence[str] | None = None,
    **kwargs: Any,
) -> ModelOrConfig:
    """Patch ``model`` in place with a position-encoding method and return it.

    Patching again replaces the previous patch: every patch starts from the checkpoint's own
    rope parameters, recorded in ``config.hf_posext``. A patch is all or nothing: every check
    runs before anything changes, and on any error the model (config, rotary modules, position
    table, attention implementation) is as it was. A model gets a patched private copy of its
    config (``model.config`` is a new object afterwards), so other models built from the same
    config object are never changed; a config passed itself is patched in place.

    Args:
        model: a decoder whose rotary embedding follows transformers' rope_parameters contract
            (`hf_posext.architectures`; tested on [`SUPPORTED_MODEL_TYPES`][hf_posext.SUPPORTED_MODEL_TYPES]), or its
            config.
        method: a name from [`available_methods`][hf_posext.available_methods] or a method config object.
        factor: the context scale s >= 1; ``None`` keeps the config object's (or the default 1).
        original_max_position_embeddings: the pretraining context; default: the checkpoint's.
        override: replace a scaling the checkpoint already ships (``llama3``, ``yarn``...) by plain
            RoPE at its pretraining context. Without it a static method composes on that scaling
            and extends the context the checkpoint reaches (see `hf_posext.methods`).
        layer_types: with per-layer-type rope parameters (Gemma 3), the layer types to patch;
            default: all but the local ones (sliding window), whose short range needs no extension.
        **kwargs: the method's own arguments, e.g. ``beta_fast`` for YaRN.

    Returns:
        The same object, patched.

    Raises:
        ValueError: an unknown method or argument, a bad value, an unsupported architecture,
            or, when ``override`` is False, a checkpoint scaling the method cannot compose on
            (a dynamic one, or any under a dynamic method or one that replaces RoPE).

    Examples:
        >>> model = hf_posext.patch_model(model, "yarn", factor=4)  # 4k -> 16k
    """
    if factor is not None:
        kwargs["factor"] = factor
    if original_max_position_embeddings is not None:
        kwargs["original_max_position_embeddings"] = original_max_position_embeddings
    config = _config_of(model)
    spec = method_config(method, **kwargs)
    architectures.check_config(config)
    if isinstance(model, nn.Module):
        architectures.check_rotary_modules(model)
    _check_method_fits(config, spec, model if isinstance(model, nn.Module) else None)
    # Patch a copy: every check (ours, the surgery's, transformers' validators - Phi-3's config accepts
    # only default and longrope) runs before the caller's config or model is touched. The copy becomes a
    # model's private config: a config object shared with other models (two models built from one
    # config) must not change under them.
    patched = copy.deepcopy(config)
    previous = _unpatch_previous_config(patched)
    _patch_config(patched, spec, override, layer_types)
    if not isinstance(model, nn.Module):
        config.__dict__.clear()
        config.__dict__.update(patched.__dict__)
        return model
    saved = snapshot(_modules_with_originals(model))
    try:
        _replace_config(model, config, patched)
        before = dict(model.named_modules())
        if previous is not None:
            surgery_for(previous).unpatch_modules(previous, model)  # module surgery reads no config
        _swap_rotary_modules(model, keep_originals=previous is None)
        surgery = surgery_for(spec)
        surgery.patch_modules(spec, model)
        if previous is not None:
            surgery.inherit_modules(spec, model, before)
    except BaseException:
        restore(saved)
        raise
    return model


def _unpatch_previous_config(config: PreTrainedConfig) -> MethodConfig | None:
    """Undo, on ``config``, what a previous patch did beyond rope parameters; the previous method.

    A re-patch starts from the checkpoint (ALiBi's attention implementation, absolute encodings'
    position table).
    """
    record = getattr(config, CONFIG_KEY, None)
    if record is None:
        return None
    previous = method_from_record(record)
    surgery_for(previous).unpatch_config(previous, config, record)
    return previous


def _modules_with_originals(model: nn.Module) -> list[nn.Module]:
    originals = model.__dict__.get(_ORIGINAL_MODULES, {})
    found = {id(m): m for m in model.modules()}
    for module in originals.values():
        found.update({id(m): m for m in module.modules()})
    return list(found.values())


def _replace_config(model: nn.Module, old: PreTrainedConfig, new: PreTrainedConfig) -> None:
    """Point every module of ``model`` (and the kept original rotary modules) that holds ``old`` at ``new``."""
    for module in _modules_with_originals(model):
        for name, value in list(module.__dict__.items()):
            if value is old:
                module.__dict__[name] = new


def _check_method_fits(config: PreTrainedConfig, method: MethodConfig, model: nn.Module | None) -> None:
    """Refuse a method where it would be wrong (before anything is changed): the method's own
    limits (`hf_posext.methods.base.MethodConfig.per_layer_type_rope`), then its surgery's
    `hf_posext.methods.surgery.Surgery.check`."""
    nested = architectures.nested_rope_keys(config)
    if nested and not method.per_layer_type_rope:
        fitting = [name for name in available_methods() if method_class(name).per_layer_type_rope]
        raise ValueError(
            f"{method.name} does not support per-layer-type rope parameters (model_type={config.model_type!r}, layer "
            f"types {nested}); methods that do: {', '.join(fitting)}"
        )
    surgery_for(method).check(method, config, model)


def snapshot_model(model: nn.Module) -> Snapshot:
    """The state `hf_posext.patching.transaction.restore` puts back: config, rotary modules, surgery, hooks.

    Patches only ever replace configs and modules (never change them in place), so restoring it
    after any patches and unpatches gives the model as it was, patched or not, bit for bit.
    """
    return snapshot(_modules_with_originals(model))


def method_from_record(record: dict[str, Any]) -> MethodConfig:
    """The method config a ``config.hf_posext`` record was written by.

    Raises:
        ValueError: a method this process has not registered, naming the import (a plugin's: its checkpoint
            loads without it, `hf_posext.validation.unknown_method`, but this needs its code).
    """
    if unknown_method(record) is not None:
        refuse_to_build(record["method"])
    fields = {f.name for f in dataclasses.fields(method_class(record["method"]))}
    return method_config(record["method"], **{k: v for k, v in record.items() if k in fields})


def unpatch_model(model: ModelOrConfig) -> ModelOrConfig:
    """Undo [`patch_model`][hf_posext.patch_model]: the checkpoint's own rope parameters and rotary modules come back.

    A model gets a private copy of its config, as in [`patch_model`][hf_posext.patch_model].

    Raises:
        ValueError: if ``model`` carries no hf-posext patch.
    """
    config = _config_of(model)
    record = getattr(config, CONFIG_KEY, None)
    if record is None:
        raise ValueError(f"{type(model).__name__} carries no hf-posext patch to undo")
    if isinstance(model, nn.Module):  # as in patch_model: never change a config other models share
        private = copy.deepcopy(config)
        _replace_config(model, config, private)
        config, record = private, getattr(private, CONFIG_KEY)
    spec = method_from_record(record)
    surgery = surgery_for(spec)
    config.rope_parameters = copy.deepcopy(record["base_rope_parameters"])
    config.max_position_embeddings = int(record["base_max_position_embeddings"])
    surgery.unpatch_config(spec, config, record)
    delattr(config, CONFIG_KEY)
    readers.clear_reader_fields(config, record.get("base_reader_fields", {}))
    if isinstance(model, nn.Module):
        surgery.unpatch_modules(spec, model)
        originals = model.__dict__.pop(_ORIGINAL_MODULES, {})
        for name, module in list(integration.rotary_modules(model)):
            original = originals.get(name)
            restored = original.to(device=integration.rotary_device(module)) if original is not None else None
            integration.replace_module(model, name, restored or integration.rebuild_rotary(module))
    return model


def patch_info(model: nn.Module | PreTrainedConfig) -> dict[str, Any]:
    """What position encoding ``model`` carries.

    Returns:
        ``{"method": name or None, "rope_parameters": ..., "max_position_embeddings": ...}`` plus,
        for a patched model, the method's arguments, ``original_max_position_embeddings`` and
        the ``context_length`` the patch reaches: JSON-ready. [`patched_method`][hf_posext.patched_method] gives the
        method's config object.
    """
    config = _config_of(model)
    record = copy.deepcopy(getattr(config, CONFIG_KEY, None) or {})
    info: dict[str, Any] = {"method": record.pop("method", None)}
    info.update({k: v for k, v in record.items() if not k.startswith("base_")})
    info["rope_parameters"] = copy.deepcopy(config.rope_parameters)
    info["max_position_embeddings"] = config.max_position_embeddings
    return info


def patched_method(model: nn.Module | PreTrainedConfig) -> MethodConfig | None:
    """The method config ``model`` was patched with (``None`` for an unpatched model), with
    ``original_max_position_embeddings`` resolved to the context it was applied to.

    [`patch_info`][hf_posext.patch_info] stays a plain dict (it is printed and written as JSON); this is the object.

    Examples:
        >>> hf_posext.patched_method(hf_posext.patch_model(model, "yarn", factor=4))  # doctest: +ELLIPSIS
        YarnConfig(factor=4.0, ...)
    """
    record = getattr(_config_of(model), CONFIG_KEY, None)
    return method_from_record(record) if record is not None else None


__all__ = [
    "MethodName",
    "method_from_record",
    "patch_info",
    "patch_model",
    "patched_method",
    "snapshot_model",
    "unpatch_model",
]
