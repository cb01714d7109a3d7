"""The base of the training-free methods that remap positions inside attention (Self-Extend, DCA, STRING, ReRoPE).

They keep the checkpoint's rotary embedding as it is (plain, raised theta, or a shipped static
scaling: llama3, yarn, longrope) and score some (query, key) pairs at other positions
(:mod:`hf_posext.attention.remap`). Their surgery selects the remapping attention wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .base import BaseRope, MethodConfig


@dataclass(frozen=True)
class AttentionRemapMethod(MethodConfig):
    """Shared by methods that leave RoPE's frequencies alone and remap positions in attention."""

    scales_rope: ClassVar[bool] = False
    #: They run on top of whatever static scaling the checkpoint ships: its frequencies stay.
    composes: ClassVar[bool] = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return dict(base.rope_parameters)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return dict(base.rope_parameters)

    def max_position_embeddings(self, base: BaseRope) -> int:
        return self.reach(base.original_max_position_embeddings)

    def reach(self, original: int) -> int:
        """The context the patched model advertises, for the checkpoint's context ``original`` (L0)."""
        raise NotImplementedError

    def config_fields(self, original: int) -> dict[str, Any]:
        """Config keys beyond rope parameters that a patched config carries (what engines read)."""
        return {}

    def remapping(self, original: int) -> Any:
        """The :class:`~hf_posext.attention.remap.Remapping` for L0 = ``original`` (validates against it)."""
        raise NotImplementedError
