"""The absolute position encodings' configs (``sinusoidal``, ``learned``): baselines for training from scratch.

Rotary embeddings are switched off (`hf_posext.methods.norope`); the table and the hook that
adds it to the input embeddings are the surgery's (`surgery`). The formulas: docs/methods/absolute.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import BaseRope, real_number
from ..norope import NoRopeMethod


@dataclass(frozen=True)
class _AbsoluteMethod(NoRopeMethod):
    """Shared by the absolute encodings: rotary off, a position table added by the surgery."""


@dataclass(frozen=True)
class SinusoidalConfig(_AbsoluteMethod):
    """Vaswani et al.'s fixed sin/cos table added to the input embeddings; rotary off.

    Args:
        theta: the wavelength base (10000 in the paper).
    """

    paper: ClassVar[str] = "Vaswani et al. 2017, Attention Is All You Need, sec. 3.5"

    theta: float = 10000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        theta = real_number(self.name, "theta", self.theta, "> 1")
        if not theta > 1:
            raise ValueError(f"{self.name}: theta must be a number > 1, got {self.theta!r}")
        object.__setattr__(self, "theta", theta)


@dataclass(frozen=True)
class LearnedConfig(_AbsoluteMethod):
    """A trainable position table added to the input embeddings; rotary off.

    Args:
        max_length: rows of the table, the longest input the model accepts; ``None`` takes the
            checkpoint's ``max_position_embeddings``.
    """

    paper: ClassVar[str] = "learned absolute positions (Gehring et al. 2017; GPT-2)"
    adds_weights: ClassVar[bool] = True

    max_length: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_whole("max_length", 1, "a positive int or None")

    def max_position_embeddings(self, base: BaseRope) -> int:
        return self.max_length or base.max_position_embeddings
