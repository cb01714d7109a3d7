"""ALiBi's config: rotary off, a per-head linear bias on the attention logits instead.

Press et al. 2022, arXiv:2108.12409; how it plugs into transformers and the backends:
docs/methods/alibi.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..norope import NoRopeMethod
from .attention import BACKENDS, Backend


@dataclass(frozen=True)
class AlibiConfig(NoRopeMethod):
    """ALiBi (Press et al. 2022): rotary off, -m_h (i - j) added to each head's logits.

    Args:
        backend: the attention path: "auto" (flash-attn on CUDA in fp16/bf16 when installed,
            FlexAttention on other CUDA runs, SDPA on CPU), "eager", "sdpa", "flex" (no L x L
            bias in memory; forward only on CPU), "flash", or "folded" (the bias as extra channels of
            SDPA's causal kernel: no L x L bias, trains on CPU; masks it cannot express run "sdpa").
    """

    paper: ClassVar[str] = "Press et al. 2022, ALiBi, arXiv:2108.12409"

    backend: Backend = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in BACKENDS:
            raise ValueError(f"{self.name}: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
