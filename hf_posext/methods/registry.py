"""The method registry: one [`register_method`][hf_posext.register_method] (or
[`register_family`][hf_posext.register_family]) call per family folder.

A family folder's ``__init__.py`` registers its config classes, their surgery, the rope types
and attention functions transformers must know, aliases, and optionally a load-time hook that
recognises the method in a config that ships it in another form (DCA: Qwen's
``dual_chunk_attention_config``). Everything else (CLIs, the loader,
tests, ``import hf_posext``'s registration with transformers) reads this registry instead of
writing method names down. Longer than ~400 lines: the registration's checks and its all-or-nothing
keep read and restore the registry's own tables, so they live beside them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import integration
from ..method_names import ALIASES, METHODS, available_methods, registered_name
from ..post_import import deprecated_attribute
from .base import MethodConfig
from .surgery import NO_SURGERY, Surgery
from .training import TRAININGS, Training, built_trainings


class RopeType(NamedTuple):
    """A rope type registered with transformers' ``ROPE_INIT_FUNCTIONS``.

    Attributes:
        init: ``fn(config, device=None, seq_len=None, layer_type=None) -> (inv_freq, attention_factor)``.
        validate: ``validate(config, rope_parameters, ignore_keys)``, called when a config is validated:
            a missing required key raises ``KeyError``, an unknown one is warned about
            ([`check_received_keys`][hf_posext.check_received_keys]), a bad value raises ``ValueError``.
        old_names: earlier names of the type that saved checkpoints may still carry (registered too).
    """

    init: Callable[..., Any]
    validate: Callable[[Any, dict[str, Any], set[str] | None], None]
    old_names: tuple[str, ...] = ()


class AttentionFunctions(NamedTuple):
    """An attention implementation registered with transformers (``config._attn_implementation = name``).

    Attributes:
        forward: the ``AttentionInterface`` function.
        mask: the ``AttentionMaskInterface`` function (without one transformers builds no causal mask),
            or the name of the kernel masked alike (``"sdpa"``), looked up when transformers'
            ``masking_utils`` is imported.
    """

    forward: Callable[..., Any]
    mask: Callable[..., Any] | str


@dataclass(frozen=True)
class MethodSpec:
    """One method of a family: its name, config class, surgery, aliases and what fine-tuning needs of it."""

    name: str
    config_cls: type[MethodConfig]
    surgery: Surgery | type[Surgery] | None = None
    aliases: tuple[str, ...] = ()
    training: Training | type[Training] | None = None


#: A family's load-time hook: ``hook(config)`` is the method a config without an hf-posext record
#: ships in another form, or ``None``; it raises ``ValueError`` naming a bad field.
ShippedConfig = Callable[[Any], "MethodConfig | None"]


@dataclass(frozen=True)
class Family:
    """What one family folder registered."""

    name: str
    methods: tuple[str, ...]
    rope_types: dict[str, RopeType] = field(default_factory=dict)
    attention: dict[str, AttentionFunctions] = field(default_factory=dict)
    shipped_config: ShippedConfig | None = None


_SURGERY: dict[type[MethodConfig], Surgery] = {}
_FAMILIES: dict[str, Family] = {}
_ROPE_TYPES: dict[str, RopeType] = {}
_ATTENTION: dict[str, AttentionFunctions] = {}
_installed = False


def register_method(
    name: str,
    config_cls: type[MethodConfig],
    *,
    surgery: Surgery | type[Surgery] | None = None,
    aliases: Sequence[str] = (),
    rope_types: Mapping[str, RopeType] | None = None,
    attention: Mapping[str, AttentionFunctions] | None = None,
    family: str | None = None,
    shipped_config: ShippedConfig | None = None,
    training: Training | type[Training] | None = None,
) -> Family:
    """Register a one-method family; see [`register_family`][hf_posext.register_family].

    ``family`` defaults to the folder ``config_cls`` is defined in (``hf_posext/methods/<family>/``),
    else to ``name``.
    """
    return register_family(
        family or _folder_of(config_cls) or name,
        methods=[MethodSpec(name, config_cls, surgery, tuple(aliases), training)],
        rope_types=rope_types,
        attention=attention,
        shipped_config=shipped_config,
    )


def _folder_of(config_cls: type) -> str | None:
    """The family folder (a sub-package of hf_posext.methods) ``config_cls`` is defined in, or ``None``."""
    methods, _, _ = __name__.rpartition(".")
    module = getattr(config_cls, "__module__", "")
    if not module.startswith(methods + "."):
        return None
    folder = module[len(methods) + 1 :].split(".")[0]
    return folder if hasattr(sys.modules.get(f"{methods}.{folder}"), "__path__") else None


def register_family(
    name: str,
    *,
    methods: Sequence[MethodSpec],
    rope_types: Mapping[str, RopeType] | None = None,
    attention: Mapping[str, AttentionFunctions] | None = None,
    shipped_config: ShippedConfig | None = None,
) -> Family:
    """Register a family's methods, surgery, rope types and attention functions, all or nothing.

    A spec's ``training`` ([`Training`][hf_posext.Training]) is what fine-tuning needs of the method (its
    ``--set`` training options, its hooks); the recipe asks it (`training_for`) instead of the method's name.
    ``shipped_config`` is the family's load-time hook (`ShippedConfig`): a model built from a
    config without an hf-posext record that the hook recognises is patched with the method it returns
    (`shipped_method`, called by `hf_posext.loading`). Sets each config class's ``name``.
    Once ``import hf_posext`` has registered the registry with transformers, a family registered
    later (a plugin) is registered with transformers at once.

    Raises:
        ValueError: a name or alias taken or not lower-case, a class that is not a
            [`MethodConfig`][hf_posext.MethodConfig], or a rope type / attention name that
            another family registered with other functions, or a training whose options clash
            (`hf_posext.methods.training.check_training`).
    """
    rope_types, attention = dict(rope_types or {}), dict(attention or {})
    methods = _checked_specs(name, methods)
    _check_functions(name, rope_types, attention, shipped_config)
    _check_names_free(rope_types, attention)
    surgeries = {
        spec.config_cls: spec.surgery() if isinstance(spec.surgery, type) else spec.surgery
        for spec in methods
        if spec.surgery is not None
    }  # built before anything is kept: a surgery whose constructor raises registers nothing
    trainings = built_trainings([(spec.name, spec.config_cls, spec.training) for spec in methods])
    registered = Family(name, tuple(spec.name for spec in methods), rope_types, attention, shipped_config)
    _keep(registered, methods, surgeries, trainings)
    return registered


def _checked_specs(name: str, methods: Sequence[MethodSpec]) -> list[MethodSpec]:
    """The family's specs as a list, refused unless ``name`` is new and every spec a `MethodSpec` with new,
    lower-case names and aliases and a frozen dataclass `MethodConfig` subclass.

    Raises:
        ValueError: naming the family, the name or the class.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a method family's name is a non-empty string, got {name!r}")
    if name in _FAMILIES:
        raise ValueError(f"method family {name!r} is already registered")
    methods = list(methods)
    if not methods or not all(isinstance(spec, MethodSpec) for spec in methods):
        raise ValueError(f"method family {name!r}: methods must be a non-empty list of MethodSpec, got {methods!r}")
    keys = [key for spec in methods for key in (spec.name, *spec.aliases)]
    for key in keys:
        if not isinstance(key, str) or not key or key != key.lower():
            raise ValueError(f"method names are non-empty lower-case strings, got {key!r}")
        if key in METHODS or key in ALIASES or keys.count(key) > 1:
            raise ValueError(f"method name {key!r} is already registered")
    for spec in methods:
        if not (isinstance(spec.config_cls, type) and issubclass(spec.config_cls, MethodConfig)):
            raise ValueError(f"{spec.name}: config_cls must be a MethodConfig subclass, got {spec.config_cls!r}")
        if not dataclasses.is_dataclass(spec.config_cls):
            raise ValueError(f"{spec.name}: config_cls {spec.config_cls.__name__} must be a frozen dataclass")
    return methods


def _check_names_free(rope_types: dict[str, RopeType], attention: dict[str, AttentionFunctions]) -> None:
    """Refuse rope types and attention names that another family, or transformers itself, registered with
    other functions (checked before anything is kept: a registration is all or nothing)."""
    for kind, given, known in (("rope type", rope_types, _ROPE_TYPES), ("attention", attention, _ATTENTION)):
        for key, value in given.items():
            if key in known and known[key] != value:
                raise ValueError(f"{kind} {key!r} is already registered with other functions")
    for rope_type, entry in rope_types.items():
        for key in (rope_type, *entry.old_names):
            integration.check_rope_type_free(key, entry.init)
    for attention_name, functions in attention.items():
        integration.check_attention_free(attention_name, functions.forward)


def _keep(
    registered: Family,
    methods: list[MethodSpec],
    surgeries: dict[type[MethodConfig], Surgery],
    trainings: dict[type, Training],
) -> None:
    """Keep a checked family in the registry (and with transformers once installed); on any failure, put
    the registry and the config classes' ``name`` back as they were and raise."""
    kept = (dict(METHODS), dict(ALIASES), dict(_SURGERY), dict(TRAININGS), dict(_ROPE_TYPES), dict(_ATTENTION))
    names = {spec.config_cls: spec.config_cls.__dict__.get("name") for spec in methods}
    try:
        for spec in methods:
            spec.config_cls.name = spec.name
            METHODS[spec.name] = spec.config_cls
            for alias in spec.aliases:
                ALIASES[alias] = spec.name
        _SURGERY.update(surgeries)
        TRAININGS.update(trainings)
        _ROPE_TYPES.update(registered.rope_types)
        _ATTENTION.update(registered.attention)
        _FAMILIES[registered.name] = registered
        if _installed:
            _register_family_with_transformers(registered)
    except BaseException:  # put the registry back: a retry meets the same checks, not "already registered"
        _FAMILIES.pop(registered.name, None)
        for table, before in zip((METHODS, ALIASES, _SURGERY, TRAININGS, _ROPE_TYPES, _ATTENTION), kept):
            table.clear()
            table.update(before)
        for cls, old in names.items():
            if old is None:
                del cls.name  # inherited again
            else:
                cls.name = old
        raise


def _check_functions(
    name: str,
    rope_types: Mapping[str, RopeType],
    attention: Mapping[str, AttentionFunctions],
    shipped_config: ShippedConfig | None,
) -> None:
    """Refuse, before anything is kept, a rope type, attention entry or load-time hook that is not callable.

    Raises:
        ValueError: naming the family, the entry and what it must be.
    """
    for rope_type, entry in rope_types.items():
        if not (isinstance(rope_type, str) and isinstance(entry, RopeType)):
            raise ValueError(
                f"method family {name!r}: rope_types maps a name to a RopeType, got {rope_type!r}: {entry!r}"
            )
        if not (callable(entry.init) and callable(entry.validate)):
            raise ValueError(f"method family {name!r}: rope type {rope_type!r} needs a callable init and validate")
    for attention_name, functions in attention.items():
        if not (isinstance(functions, AttentionFunctions) and callable(functions.forward)):
            raise ValueError(
                f"method family {name!r}: attention {attention_name!r} needs AttentionFunctions(forward, mask)"
            )
        if not (callable(functions.mask) or isinstance(functions.mask, str)):
            raise ValueError(
                f"method family {name!r}: attention {attention_name!r}'s mask must be a function or a kernel name"
            )
    if shipped_config is not None and not callable(shipped_config):
        raise ValueError(f"method family {name!r}: shipped_config must be callable, got {shipped_config!r}")


def register_with_transformers() -> None:
    """Register every registered rope type and attention function with transformers (``import hf_posext`` does)."""
    global _installed
    integration.accept_longrope_reader_keys()
    for family in _FAMILIES.values():
        _register_family_with_transformers(family)
    _installed = True


def _register_family_with_transformers(family: Family) -> None:
    for rope_type, entry in family.rope_types.items():
        for key in (rope_type, *entry.old_names):
            integration.register_rope_type(key, entry.init, entry.validate)
    for attention_name, functions in family.attention.items():
        integration.register_attention(attention_name, functions.forward, functions.mask)


def shipped_method(config: Any) -> MethodConfig | None:
    """The method ``config`` ships in another form, by the first family hook that recognises it, else ``None``.

    Raises:
        ValueError: from the hook, naming the config's bad field.
    """
    for family in _FAMILIES.values():
        if family.shipped_config is not None:
            method = family.shipped_config(config)
            if method is not None:
                return method
    return None


def families() -> dict[str, Family]:
    """``{family name: what it registered}``, sorted by name."""
    return dict(sorted(_FAMILIES.items()))


def rope_types() -> dict[str, RopeType]:
    """Every rope type a family registered (old names excluded)."""
    return dict(_ROPE_TYPES)


def attention_functions() -> dict[str, AttentionFunctions]:
    """Every attention implementation a family registered."""
    return dict(_ATTENTION)


def canonical_name(name: str) -> str:
    """The registered name of ``name`` or of the alias ``name``.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    return method_class(name).name


def method_class(name: str) -> type[MethodConfig]:
    """The config class registered under ``name`` or one of its aliases.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    return METHODS[registered_name(name)]


def method_config(method: str | MethodConfig, **kwargs: Any) -> MethodConfig:
    """A method config from a name (or alias) and keyword arguments; a config passes through (with ``kwargs`` replaced).

    Examples:
        >>> hf_posext.method_config("yarn", factor=4)  # doctest: +NORMALIZE_WHITESPACE
        YarnConfig(factor=4.0, original_max_position_embeddings=None, beta_fast=32.0, beta_slow=1.0,
                   attention_factor=None)

    Raises:
        ValueError: for an unknown method or an argument the method does not take.
    """
    if isinstance(method, MethodConfig):
        if kwargs:
            return dataclasses.replace(method, **kwargs)
        return method
    cls = method_class(method)
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"method {cls.name!r} does not take {unknown}; its arguments are: {', '.join(allowed)}")
    return cls(**kwargs)


def __getattr__(name: str) -> Any:  # make_method, the 0.1 name of method_config
    return deprecated_attribute(__name__, name)


def surgery_for(method: MethodConfig | type[MethodConfig]) -> Surgery:
    """The surgery registered for ``method``'s class or its nearest base class (`NO_SURGERY` if none)."""
    cls = method if isinstance(method, type) else type(method)
    for base in cls.__mro__:
        if base in _SURGERY:
            return _SURGERY[base]
    return NO_SURGERY


def needs_surgery(method: str | MethodConfig | type[MethodConfig]) -> bool:
    """Whether ``method`` does more to a model than new rope parameters (then a saved checkpoint
    needs ``import hf_posext`` or [`hf_posext.from_pretrained`][hf_posext.from_pretrained] to load as saved)."""
    return surgery_for(method_class(method) if isinstance(method, str) else method) is not NO_SURGERY


def composable_methods() -> list[str]:
    """The methods that can be applied on top of a checkpoint's own static scaling."""
    return [name for name in available_methods() if METHODS[name].composes]


def config_classes() -> dict[str, type[MethodConfig]]:
    """``{class name: config class}`` of every registered method (e.g. ``"YarnConfig"``)."""
    return {cls.__name__: cls for cls in (method_class(name) for name in available_methods())}
