"""Self-Extend's config: group size G, neighbour window W, or a factor they are derived from.

Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
arXiv:2401.01325, section 3 (code: datamllab/LongLM ``self_extend_patch``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..remapping import AttentionRemapMethod
from .remap import SelfExtendRemapping


@dataclass(frozen=True)
class SelfExtendConfig(AttentionRemapMethod):
    """Self-Extend (Jin et al. 2024): neighbours at true positions, farther keys at grouped positions.

    Keys within ``window_size`` of a query keep their positions; farther pairs score with the key
    at ``j // G`` and the query at ``i // G + W - W // G``. The model then never sees a distance
    beyond its pretraining context up to ``(L0 - W) * G + W`` tokens.

    Args:
        factor: the context scale s; with ``group_size`` or ``window_size`` missing they are derived
            so that the reach ``(L0 - W) G + W`` is at least ``s L0`` (W = L0 // 4 by default).
        group_size: G, an int >= 1 (1: no grouping, the model unchanged).
        window_size: W, an int with 1 <= W < L0.
    """

    paper: ClassVar[str] = "Jin et al. 2024, Self-Extend, arXiv:2401.01325"

    group_size: int | None = None
    window_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_whole("group_size", 1, "an int >= 1 (or None: derived from factor)")
        self._check_whole("window_size", 1, "an int >= 1 below the original context (or None: L0 // 4)")
        if self.factor > 1 and self.group_size is not None and self.window_size is not None:
            raise ValueError(
                f"{self.name}: give factor or (group_size, window_size), not all three (the reach (L0 - W) G + W is "
                f"the context); got factor={self.factor!r}, group_size={self.group_size!r}, "
                f"window_size={self.window_size!r}"
            )

    def needs_factor(self) -> bool:
        """Without a factor or a ``group_size`` the group resolves to 1: the model unchanged."""
        return self.group_size is None

    def resolve(self, original: int) -> tuple[int, int]:
        """``(G, W)`` for the checkpoint's context ``original`` (L0).

        Raises:
            ValueError: ``window_size >= L0``, or a ``group_size`` too small to reach ``factor * L0``.
        """
        window = self.window_size
        if window is None:
            if self.group_size is not None and self.factor > 1:
                if self.group_size <= self.factor:
                    raise ValueError(
                        f"{self.name}: group_size={self.group_size} must exceed factor={self.factor} "
                        f"to reach factor * L0 with a window; pass window_size instead"
                    )
                window = int((self.group_size - self.factor) * original // (self.group_size - 1))
            else:
                window = max(1, original // 4)
        self._fit("window_size", window, 1, original, f"the original context L0={original}")
        group = self.group_size
        if group is None:
            group = max(1, math.ceil((self.factor * original - window) / (original - window)))
        return group, window

    def reach(self, original: int) -> int:
        group, window = self.resolve(original)
        return (original - window) * group + window

    def remapping(self, original: int) -> SelfExtendRemapping:
        group, window = self.resolve(original)
        return SelfExtendRemapping(group, window)
