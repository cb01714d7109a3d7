"""STRING's config: the shift S and the local window W (the authors' defaults from L0).

An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?", arXiv:2410.18745,
section 4 (code: HKUNLP/STRING ``string_for_llama.py``; README: ``shifted_offset = 0.33 L``,
``small_local_value = 128``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..remapping import AttentionRemapMethod
from .remap import StringRemapping

#: The authors' ``shifted_offset`` as a share of the trained context and their ``small_local_value``.
SHIFT_SHARE, LOCAL_WINDOW = 0.33, 128
#: The authors' cos/sin multiplier (``replace_with_string``: "STRING will make the attention map smooth").
QK_SCALE = 0.1 * math.log(2) + 1


@dataclass(frozen=True)
class StringConfig(AttentionRemapMethod):
    """STRING (An et al. 2024): distances d >= S are scored at d - S + W, the well-trained small ones.

    Distances below the shift S keep their positions; from S on they are shifted down to
    ``d - S + W``, so the last ``S - W`` positions of the trained window, rarely seen in pretraining,
    are never used. The key at ``d = S`` is scored at ``W``, as the authors' decode path does.

    Args:
        factor: the context the patched config advertises, ``factor * L0`` (default 1: STRING is
            meant for the trained window; past ``L0 + S - W`` distances exceed the trained ones).
        shift: S, an int with W < S < L0; default ``int(0.33 * L0)``.
        local_window: W, an int >= 1 below S; default 128, or ``S // 2`` when that is smaller.
        qk_scale: multiply q and k by ``1 + 0.1 ln 2`` (logits by its square) at every length, as the
            authors' code does (off by default: then inputs shorter than S run the model unchanged).
    """

    paper: ClassVar[str] = "An et al. 2024, STRING, arXiv:2410.18745"

    shift: int | None = None
    local_window: int | None = None
    qk_scale: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_whole("shift", 1, "an int >= 1 below L0 (or None: 0.33 L0)")
        self._check_whole("local_window", 1, "an int >= 1 below shift (or None: 128)")
        if not isinstance(self.qk_scale, bool):
            raise ValueError(f"{self.name}: qk_scale must be True or False, got {self.qk_scale!r}")
        if self.shift is not None and self.local_window is not None and self.local_window >= self.shift:
            raise ValueError(
                f"{self.name}: local_window must be below shift={self.shift} (W < S), got {self.local_window!r}"
            )

    def resolve(self, original: int) -> tuple[int, int]:
        """``(S, W)`` for the checkpoint's context ``original`` (L0).

        Raises:
            ValueError: ``shift >= L0`` or ``local_window >= shift``.
        """
        shift = self.shift if self.shift is not None else int(SHIFT_SHARE * original)
        self._fit("shift", shift, 2, original, f"the original context L0={original}")
        window = self.local_window if self.local_window is not None else min(LOCAL_WINDOW, shift // 2)
        return shift, self._fit("local_window", window, 1, shift, f"shift={shift}")

    def config_fields(self, original: int) -> dict[str, Any]:
        """``string_config``, which the authors' vLLM fork (HKUNLP/STRING ``vllm_string``) reads for Llama."""
        shift, window = self.resolve(original)
        return {"string_config": {"shifted_offset": shift, "local_value": window}}

    def remapping(self, original: int) -> StringRemapping:
        return StringRemapping(*self.resolve(original), QK_SCALE if self.qk_scale else None)
