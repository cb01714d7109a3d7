"""The method registry and the config base class every method derives from.

A method is a frozen dataclass registered under a lower-case name with :func:`register`.
Its fields are the method's hyper-parameters, validated in ``__post_init__`` so that a bad
value fails at construction with a message naming it. What a method does to a model is
split in two, so that a config object alone can be patched before any weights exist:

* :meth:`PositionMethod.rope_parameters` returns the ``rope_parameters`` dict a transformers
  config should carry (a native ``rope_type`` wherever transformers has one, so vanilla
  transformers and vLLM load the checkpoint);
* :meth:`PositionMethod.max_position_embeddings` returns the context the patched config
  advertises.

A method config holds no model surgery: what ALiBi, the absolute encodings and the dynamic
methods do to a model beyond rope parameters is their adapter's (:mod:`hf_posext.adapters`).

The registry is the one list of methods: :func:`available_methods`, :func:`method_aliases`,
:func:`canonical_name` and :func:`method_class` are what other modules (CLIs, demos, reports) use
instead of writing names down.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..rope_utils import longrope_rope_parameters
from ..validation import real_number, whole_number  # re-exported: the methods' checks


@dataclass(frozen=True)
class BaseRope:
    """What a model's rotary embedding was before any hf-posext patch.

    Attributes:
        rope_parameters: the checkpoint's own ``rope_parameters`` (``rope_type="default"``).
        max_position_embeddings: the checkpoint's own ``config.max_position_embeddings``.
        original_max_position_embeddings: the pretraining context, ``L_orig`` in the papers.
        rotary_dim: the number of rotated channels per head, ``d`` in the papers.
        pair_divisors: ``None`` for plain RoPE; for a checkpoint that ships a static scaling
            (llama3, linear, yarn, longrope) the per-pair divisors c_i of its frequencies,
            theta^(-2i/d) / c_i, ``[rotary_dim // 2]`` float64. A method then composes on them
            (:meth:`PositionMethod.composed_rope_parameters`) and ``original_max_position_embeddings``
            is the context the checkpoint already reaches (L0).
        attention_factor: the checkpoint's own cos/sin multiplier (1 for plain RoPE and llama3).
    """

    rope_parameters: dict[str, Any]
    max_position_embeddings: int
    original_max_position_embeddings: int
    rotary_dim: int
    pair_divisors: torch.Tensor | None = field(default=None, compare=False)  # a tensor has no truth value
    attention_factor: float = 1.0

    @property
    def theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])

    @property
    def rope_type(self) -> str:
        return self.rope_parameters.get("rope_type", "default")


@dataclass(frozen=True)
class PositionMethod:
    """Base class of every method's config.

    Args:
        factor: context scale ``s`` >= 1; the patched model reads ``s * L_orig`` tokens.
            ``factor=1`` leaves the model's position encoding untouched.
        original_max_position_embeddings: the pretraining context ``L_orig``. ``None`` takes it
            from the checkpoint (its ``original_max_position_embeddings`` if it has one, else
            ``max_position_embeddings``).
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: Whether the method recomputes its frequencies from the current sequence length.
    dynamic: ClassVar[bool] = False
    #: Whether the method rescales RoPE (then ``factor=1`` keeps the checkpoint's rope parameters);
    #: methods that replace RoPE (ALiBi, absolute encodings) set it to False.
    scales_rope: ClassVar[bool] = True
    #: Whether ``factor`` may be set (> 1); methods without a RoPE to scale only take ``factor=1``.
    takes_factor: ClassVar[bool] = True
    #: Whether the method can be applied on top of a checkpoint's own static scaling
    #: (:meth:`composed_rope_parameters`); the others need ``override=True`` on such a checkpoint.
    composes: ClassVar[bool] = False

    factor: float = 1.0
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        factor = real_number(self.name, "factor", self.factor, ">= 1")
        if factor < 1:
            raise ValueError(
                f"{self.name}: factor must be >= 1 (a factor below 1 would shrink the context), got {factor!r}"
            )
        object.__setattr__(self, "factor", factor)
        if self.original_max_position_embeddings is not None:
            length = whole_number(self.name, "original_max_position_embeddings", self.original_max_position_embeddings,
                                  minimum=1, allowed="a positive int or None")
            object.__setattr__(self, "original_max_position_embeddings", length)

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        """The ``rope_parameters`` a config patched with this method carries."""
        raise NotImplementedError

    def pair_factors(self, base: BaseRope) -> torch.Tensor | None:
        """The per-pair divisors this method applies on top of a scaled base, ``[pairs]`` float64.

        ``None`` (the default): the method cannot compose on a checkpoint's own scaling.
        """
        return None

    def temperature(self, base: BaseRope) -> float:
        """The cos/sin multiplier this method adds on top of a scaled base's own (1: none)."""
        return 1.0

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        """The ``rope_parameters`` of this method applied on top of a base that ships a static scaling.

        The base's divisors c_i times :meth:`pair_factors`, its attention factor times
        :meth:`temperature`, written as a native ``longrope`` entry so that vanilla transformers
        loads it (:func:`~hf_posext.rope_utils.longrope_rope_parameters`).

        Raises:
            ValueError: for a method that has no composition rule (dynamic methods, methods that
                replace RoPE).
        """
        factors = self.pair_factors(base)
        if factors is None or base.pair_divisors is None:
            raise ValueError(
                f"{self.name} cannot be applied on top of the checkpoint's own rope_type={base.rope_type!r}; "
                "composable methods: linear, ntk, yarn, dynamic_yarn. Pass override=True to replace the checkpoint's scaling."
            )
        params = longrope_rope_parameters(
            base.theta,
            base.pair_divisors * factors,
            base.attention_factor * self.temperature(base),
            int(base.rope_parameters.get("original_max_position_embeddings", base.original_max_position_embeddings)),
            self.max_position_embeddings(base),
        )
        if "partial_rotary_factor" in base.rope_parameters:
            params["partial_rotary_factor"] = base.rope_parameters["partial_rotary_factor"]
        return params

    def max_position_embeddings(self, base: BaseRope) -> int:
        """The context length the patched config advertises.

        Static methods reach ``factor * L_orig``. Dynamic methods keep ``L_orig``: transformers
        starts recomputing frequencies only once a sequence outgrows ``max_position_embeddings``,
        so raising it would silently switch dynamic scaling off.
        """
        if self.dynamic:
            return base.original_max_position_embeddings
        return int(round(self.factor * base.original_max_position_embeddings))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.name, **dataclasses.asdict(self)}


_REGISTRY: dict[str, type[PositionMethod]] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, *, aliases: tuple[str, ...] = ()):
    """Class decorator adding a method config to the registry under ``name`` (and ``aliases``).

    Raises:
        ValueError: if the name or an alias is taken or not lower-case.
    """

    def wrap(cls: type[PositionMethod]) -> type[PositionMethod]:
        for key in (name, *aliases):
            if key != key.lower():
                raise ValueError(f"method names are lower-case, got {key!r}")
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"method name {key!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return wrap


def available_methods() -> list[str]:
    """The registered method names (aliases excluded), sorted."""
    return sorted(_REGISTRY)


def method_aliases() -> dict[str, str]:
    """``{alias: registered name}`` of every alias (e.g. ``"pi": "linear"``)."""
    return dict(sorted(_ALIASES.items()))


def canonical_name(name: str) -> str:
    """The registered name of ``name`` or of the alias ``name``.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    return method_class(name).name


def method_class(name: str) -> type[PositionMethod]:
    """The config class registered under ``name`` or one of its aliases.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    key = _ALIASES.get(name, name) if isinstance(name, str) else name
    if key not in _REGISTRY:
        known = ", ".join(available_methods())
        aliases = ", ".join(f"{a} (= {n})" for a, n in sorted(_ALIASES.items()))
        raise ValueError(f"unknown method {name!r}; available methods: {known}; aliases: {aliases}")
    return _REGISTRY[key]


def make_method(method: str | PositionMethod, **kwargs: Any) -> PositionMethod:
    """Build a method config from a name and keyword arguments, or pass a config through.

    Raises:
        ValueError: for an unknown method or an argument the method does not take.
    """
    if isinstance(method, PositionMethod):
        if kwargs:
            return dataclasses.replace(method, **kwargs)
        return method
    cls = method_class(method)
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"method {cls.name!r} does not take {unknown}; its arguments are: {', '.join(allowed)}")
    return cls(**kwargs)
