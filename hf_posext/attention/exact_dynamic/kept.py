"""LongRoPE's first positions on plain RoPE past its switch (``keep_first``, the paper's n-hat), in the exact cache.

Past L_orig a keep-first entry rotates positions ``p < n`` by ``p * theta^(-2i/d)`` with cos/sin
multiplier 1 and the others with the long factors (`hf_posext.methods.longrope.rope`). The
exact cache builds its tables for one frequency set per kernel call; `KeptPositions`
swaps the kept positions' plain rotation into the tables of the calls past the switch. Such a
rotation is not a function of the offset between query and key, so the offset-only decoding
path is not taken for those calls. docs/methods/longrope.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...rope_utils import default_inv_freq, kept_positions
from .rotation import cos_sin


class KeptPositions:
    """The kept positions of a model's rope entry (none but for the keep-first type) and their plain frequencies.

    Args:
        rope_parameters: the patched model's flat rope entry.
        rotary_dim: rotated channels per head.
    """

    def __init__(self, rope_parameters: dict[str, Any], rotary_dim: int) -> None:
        self.count = kept_positions(rope_parameters)
        self.theta = float(rope_parameters.get("rope_theta", 10000.0))
        self.rotary_dim = rotary_dim
        self._plain: dict[str, torch.Tensor] = {}
        self._rows: dict[tuple[tuple[bool, ...], str], torch.Tensor] = {}

    def __bool__(self) -> bool:
        return self.count > 0

    def rows(
        self, lengths: Sequence[int | None], switched: int | None, device: torch.device | str
    ) -> torch.Tensor | None:
        """``[len(lengths)]`` bool: the batch rows whose frequency length is ``switched`` (past the switch), where
        positions below `count` are kept; ``None`` when no row keeps any (the call's tables are left as built)."""
        if not self.count:
            return None
        past = tuple(length is not None and length == switched for length in lengths)
        if not any(past):
            return None
        key = (past, str(device))
        if key not in self._rows:  # a decoding step asks for the same rows again: no tensor built per step
            self._rows[key] = torch.tensor(past, device=device)
        return self._rows[key]

    def plain(self, device: torch.device | str) -> torch.Tensor:
        """Plain RoPE's ``inv_freq`` ``[rotary_dim // 2]`` fp32 (transformers' ``default``), once per device."""
        key = str(device)
        if key not in self._plain:
            self._plain[key] = default_inv_freq(self.theta, self.rotary_dim, device)
        return self._plain[key]

    def swap(
        self, positions: torch.Tensor, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Half tables ``[batch, seq, rotary_dim // 2]`` with the kept positions of the batch ``rows`` ([batch or 1]
        bool) on plain RoPE, multiplier 1 (`rotation.cos_sin`'s arithmetic)."""
        keep = (rows[:, None] & (positions < self.count))[..., None]
        plain_cos, plain_sin = cos_sin(positions, self.plain(positions.device)[None], None, dtype)
        return torch.where(keep, plain_cos, cos), torch.where(keep, plain_sin, sin)

    def swap_full(
        self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' full fp32 tables ``[batch, seq, rotary_dim]`` (``cat(freqs, freqs)``) with the kept
        positions on plain RoPE, multiplier 1: what its rotary module returns past the switch."""
        if int(positions.min()) >= self.count:  # a decoding step past the switch: nothing kept
            return cos, sin
        freqs = positions[..., None].float() * self.plain(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        keep = (positions < self.count)[..., None]
        return torch.where(keep, emb.cos(), cos), torch.where(keep, emb.sin(), sin)
