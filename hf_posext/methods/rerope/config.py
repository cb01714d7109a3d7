"""ReRoPE's config: the window w and, for leaky ReRoPE, the leak k (the authors' defaults from L0).

Su 2023, "Rectified Rotary Position Embeddings", https://kexue.fm/archives/9708 (code: bojone/rerope
``rerope_patch.py``, ``leaky_rerope_patch.py``: window 512 for a 4096 context, scaling_factor 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import real_number
from ..remapping import AttentionRemapMethod
from .remap import ReRopeRemapping

#: The authors' window as a share of the trained context (512 of Llama-2's 4096).
WINDOW_SHARE = 8


@dataclass(frozen=True)
class ReRopeConfig(AttentionRemapMethod):
    """ReRoPE (Su 2023): distance d scored at ``min(d, w)``; leaky ReRoPE at ``w + (d - w) / k`` beyond w.

    Args:
        factor: the context the patched config advertises, ``factor * L0`` (ReRoPE itself has no
            reach limit: no distance is scored beyond w, or beyond ``w + (L - w) / k`` leaky).
        window: w, an int with 1 <= w < L0; default ``L0 // 8``.
        leak: k, a number > 1 for leaky ReRoPE (the authors use 16); ``None``: plain ReRoPE.
        log_scale: multiply each query by ``max(1, ln(i + 1) / ln L0)`` as the authors' code does
            (off by default: it changes nothing below L0 tokens).
    """

    paper: ClassVar[str] = "Su 2023, ReRoPE, https://kexue.fm/archives/9708"

    window: int | None = None
    leak: float | None = None
    log_scale: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_whole("window", 1, "an int >= 1 below L0 (or None: L0 // 8)")
        if self.leak is not None:
            allowed = "> 1 (or None: plain ReRoPE)"
            leak = real_number(self.name, "leak", self.leak, allowed)
            if leak <= 1:
                raise ValueError(f"{self.name}: leak must be a finite number {allowed}, got {self.leak!r}")
            object.__setattr__(self, "leak", leak)
        if not isinstance(self.log_scale, bool):
            raise ValueError(f"{self.name}: log_scale must be True or False, got {self.log_scale!r}")

    def resolve(self, original: int) -> int:
        """The window w for the checkpoint's context ``original`` (L0).

        Raises:
            ValueError: ``window >= L0``.
        """
        window = self.window if self.window is not None else max(1, original // WINDOW_SHARE)
        return self._fit("window", window, 1, original, f"the original context L0={original}")

    def remapping(self, original: int) -> ReRopeRemapping:
        return ReRopeRemapping(self.resolve(original), self.leak, original if self.log_scale else None)
