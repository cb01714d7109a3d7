"""The base class of every method's config ([`MethodConfig`][hf_posext.MethodConfig]) and what it is applied to
([`BaseRope`][hf_posext.BaseRope]).

A method config is a frozen dataclass whose fields are the method's hyper-parameters, validated in
``__post_init__``; it says which ``rope_parameters`` and advertised context a patched config
carries, so that a config alone can be patched before any weights exist. What a method does to a
model beyond that is its [`Surgery`][hf_posext.Surgery]; the name it goes by is given
where its family registers it (`hf_posext.methods.registry`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..rope_utils import CONFIG_KEY as CONFIG_KEY  # re-exported: defined below what reads a record
from ..rope_utils import longrope_rope_parameters, proportional_rope_parameters
from ..post_import import deprecated_attribute
from ..validation import real_number, whole_number  # re-exported: the methods' checks

#: The longest context a patch may reach (positions are int32 in attention masks and kernels).
MAX_CONTEXT = 2**31 - 1


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
            (`MethodConfig.composed_rope_parameters`) and ``original_max_position_embeddings``
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
class MethodConfig:
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
    #: (`composed_rope_parameters`); the others need ``override=True`` on such a checkpoint.
    composes: ClassVar[bool] = False
    #: Whether the method works on per-layer-type rope parameters (Gemma 3: one entry per layer type).
    per_layer_type_rope: ClassVar[bool] = True
    #: For a dynamic method, the registered static method every engine reads right (readers suggest it).
    static_equivalent: ClassVar[str | None] = None
    #: Whether the method adds trained weights (learned: its position table) a format converter must map.
    adds_weights: ClassVar[bool] = False

    factor: float = 1.0
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        factor = real_number(self.name, "factor", self.factor, ">= 1")
        if factor < 1:
            raise ValueError(
                f"{self.name}: factor must be >= 1 (a factor below 1 would shrink the context), got {factor!r}"
            )
        object.__setattr__(self, "factor", factor)
        self._check_whole("original_max_position_embeddings", 1, "a positive int or None")

    def _check_whole(self, field: str, minimum: int, allowed: str) -> None:
        """An optional int ``field``, when given, normalised to an int >= ``minimum`` (`whole_number`'s message)."""
        if getattr(self, field) is not None:
            object.__setattr__(self, field, whole_number(self.name, field, getattr(self, field), minimum, allowed))

    @classmethod
    def only_hf_posext_computes(cls, record: dict[str, Any]) -> str | None:
        """What a checkpoint saved with these options (its ``hf_posext`` record) computes that no reader but
        transformers 5 after ``import hf_posext`` does, in one line, or ``None`` (default: nothing). Every other
        reader that reads its rope type right then runs another model (`hf_posext.readers.registry.judge`)."""
        return None

    def needs_factor(self) -> bool:
        """Whether this config, given no factor, leaves every model as it is (a command then asks for one).

        The methods that scale RoPE are the identity at ``factor=1``; a method whose own arguments
        set its effect (Self-Extend's ``group_size``) says so in its override.
        """
        return self.scales_rope

    def check_base(self, base: BaseRope) -> None:
        """Refuse, with a ``ValueError``, a checkpoint this config cannot be applied to, before anything is
        written and whatever the factor (``factor=1`` writes nothing of the method's own); default: none."""

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

        The base's divisors c_i times `pair_factors`, its attention factor times
        `temperature`, written as a native ``longrope`` entry so that vanilla transformers
        loads it (`hf_posext.rope_utils.longrope_rope_parameters`); on p-RoPE (``proportional``)
        as `hf_posext.rope_utils.proportional_rope_parameters`, which needs the plugin.

        Raises:
            ValueError: for a method that has no composition rule (dynamic methods, methods that
                replace RoPE).
        """
        factors = self.pair_factors(base)
        if factors is None or base.pair_divisors is None:
            raise ValueError(
                f"{self.name} cannot be applied on top of the checkpoint's own rope_type={base.rope_type!r} (it has no "
                "composition rule). Pass override=True to replace the checkpoint's scaling."
            )
        if base.rope_type == "proportional":  # p-RoPE: the divisors span head_dim, its zero pairs stay zero
            return proportional_rope_parameters(
                base.rope_parameters,
                base.pair_divisors * factors,
                base.attention_factor * self.temperature(base),
                self.factor,
                base.original_max_position_embeddings,
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

    def context_length(self, base: BaseRope) -> int:
        """The context the patched model reads: ``factor * L_orig`` (the one place it is computed).

        Raises:
            ValueError: beyond `MAX_CONTEXT` positions.
        """
        reach = self.factor * base.original_max_position_embeddings
        if reach > MAX_CONTEXT:
            raise ValueError(
                f"{self.name}: factor={self.factor!r} times the original context "
                f"{base.original_max_position_embeddings} is {reach:.4g} tokens, beyond the {MAX_CONTEXT} positions a "
                "config can hold; use a smaller factor"
            )
        return int(round(reach))

    def max_position_embeddings(self, base: BaseRope) -> int:
        """The context length the patched config advertises.

        Static methods reach `context_length`. Dynamic methods keep ``L_orig``: transformers
        starts recomputing frequencies only once a sequence outgrows ``max_position_embeddings``,
        so raising it would silently switch dynamic scaling off.
        """
        if self.dynamic:
            return base.original_max_position_embeddings
        return self.context_length(base)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.name, **dataclasses.asdict(self)}


def __getattr__(name: str) -> Any:  # PositionMethod, the 0.1 name of MethodConfig
    return deprecated_attribute(__name__, name)
