"""ReRoPE's positions as a `hf_posext.attention.remap.layout.SplitLayout`.

Pairs closer than w score at their true positions. Farther ones: ReRoPE puts the query at w and the
key at 0 (``rerope_patch.py``); leaky ReRoPE puts the query at ``(i + w (k - 1)) / k`` and the key at
``j / k`` (``leaky_rerope_patch.py``: linear scaling by k, the query offset by ``w (k - 1)``).
With ``log_scale`` every query is multiplied by ``max(1, ln(i + 1) / ln L0)``, as both files do.
"""

from __future__ import annotations

import math

import torch

from ...attention.remap import PairLayout, Queries, SplitLayout, positioned_split, rotate_by


class ReRopeRemapping:
    """ReRoPE with window ``window`` (w); leaky with ``leak`` (k) set; log-n query scale over ``log_scale`` (L0)."""

    name = "rerope"

    def __init__(self, window: int, leak: float | None, log_scale: int | None = None) -> None:
        self.window, self.leak, self.log_scale = window, leak, log_scale

    def active(self, last_position: int) -> bool:
        return last_position >= self.window  # w < L0: covers every position the log-n scale changes

    def layout(
        self, query: torch.Tensor, key: torch.Tensor, past: int, offset: int, inv_freq: torch.Tensor
    ) -> SplitLayout:
        rows, _, kv_len, _ = key.shape
        # fp32 (every device has it): positions are exact below 2**24, as transformers' own rotary angles
        key_pos = (torch.arange(kv_len, device=query.device) + offset).expand(rows, kv_len).to(torch.float32)
        return SplitLayout(self.window, past, *self._variants(query, key, key_pos[:, past:], key_pos, inv_freq))

    def positioned_layout(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> PairLayout:
        """Tokens at any increasing ``positions`` (PoSE): near when ``i - j < w``, far pairs from those positions."""
        pos = positions.to(torch.float32)[None]
        return positioned_split(self.window, positions, *self._variants(query, key, pos, pos, inv_freq))

    def _variants(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        query_pos: torch.Tensor,
        key_pos: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> tuple[tuple[Queries, torch.Tensor], tuple[Queries, torch.Tensor]]:
        window, leak = self.window, self.leak
        kv_heads = key.shape[1]
        if leak is None:
            far_query, far_key = torch.full_like(query_pos, window), torch.zeros_like(key_pos)
        else:
            far_query, far_key = (query_pos + window * (leak - 1)) / leak, key_pos / leak
        scale = None
        if self.log_scale is not None:
            scale = (torch.log1p(query_pos) / math.log(self.log_scale)).clamp(min=1)
        near = (Queries(query, kv_heads, scale=scale), key.to(torch.float32))
        far = (
            Queries(query, kv_heads, far_query - query_pos, inv_freq, scale),
            rotate_by(key, far_key - key_pos, inv_freq),
        )
        return near, far
