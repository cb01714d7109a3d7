"""STRING's positions as a `hf_posext.attention.remap.layout.SplitLayout`.

Pairs closer than S score at their true positions; farther ones with the query moved back by
``S - W`` (the key stays), as the authors' ``position_ids - shifted_offset + small_local_value``.
With ``qk_scale`` the queries carry the square of the authors' q/k multiplier, at every length.
"""

from __future__ import annotations

import torch

from ...attention.remap import PairLayout, Queries, SplitLayout, positioned_split


class StringRemapping:
    """STRING with shift ``shift`` (S), local window ``local_window`` (W) and an optional q/k multiplier."""

    name = "string"

    def __init__(self, shift: int, local_window: int, qk_scale: float | None = None) -> None:
        self.shift, self.local_window, self.qk_scale = shift, local_window, qk_scale

    def active(self, last_position: int) -> bool:
        return self.qk_scale is not None or last_position >= self.shift

    def layout(
        self, query: torch.Tensor, key: torch.Tensor, past: int, offset: int, inv_freq: torch.Tensor
    ) -> SplitLayout:
        return SplitLayout(self.shift, past, *self._variants(query, key, inv_freq))

    def positioned_layout(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> PairLayout:
        """Tokens at any increasing ``positions`` (PoSE): near when ``i - j < S``; the shift is the same."""
        return positioned_split(self.shift, positions, *self._variants(query, key, inv_freq))

    def _variants(
        self, query: torch.Tensor, key: torch.Tensor, inv_freq: torch.Tensor
    ) -> tuple[tuple[Queries, torch.Tensor], tuple[Queries, torch.Tensor]]:
        rows, kv_heads, _, _ = key.shape
        back = torch.full((rows, query.shape[2]), self.local_window - self.shift, device=query.device)
        key32 = key.to(torch.float32)
        # on q alone: one product scales every logit as q and k both would
        scale = None if self.qk_scale is None else self.qk_scale**2
        return (Queries(query, kv_heads, scale=scale), key32), (Queries(query, kv_heads, back, inv_freq, scale), key32)
