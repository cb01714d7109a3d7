"""Self-Extend's positions as a `hf_posext.attention.remap.layout.SplitLayout`.

Pairs closer than W score at their true positions; farther ones with the key at ``j // G`` and the
query at ``i // G + W - W // G``, as LongLM's selection merge.
"""

from __future__ import annotations

import torch

from ...attention.remap import PairLayout, Queries, SplitLayout, rotate_by


class SelfExtendRemapping:
    """Self-Extend with group size ``group`` and neighbour window ``window``."""

    name = "self_extend"

    def __init__(self, group: int, window: int) -> None:
        self.group, self.window = group, window

    def active(self, last_position: int) -> bool:
        return self.group > 1 and last_position >= self.window

    def layout(
        self, query: torch.Tensor, key: torch.Tensor, past: int, offset: int, inv_freq: torch.Tensor
    ) -> SplitLayout:
        group, window = self.group, self.window
        rows, kv_heads, kv_len, _ = key.shape
        key_pos = (torch.arange(kv_len, device=query.device) + offset).expand(rows, kv_len)
        query_pos = key_pos[:, past:]
        grouped_query = query_pos.div(group, rounding_mode="floor") + window - window // group
        near = (Queries(query, kv_heads), key.to(torch.float32))
        far = (
            Queries(query, kv_heads, grouped_query - query_pos, inv_freq),
            rotate_by(key, key_pos.div(group, rounding_mode="floor") - key_pos, inv_freq),
        )
        return SplitLayout(window, past, near, far)

    def positioned_layout(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> PairLayout:
        """Every pair chooses by its positions' distance ``i - j < W``."""
        group, window = self.group, self.window
        positions = positions[None]
        kv_heads = key.shape[1]
        grouped_query = Queries(
            query,
            kv_heads,
            positions.div(group, rounding_mode="floor") + window - window // group - positions,
            inv_freq,
        )
        grouped_key = rotate_by(key, positions.div(group, rounding_mode="floor") - positions, inv_freq)
        near = positions[0, :, None] - positions[0, None, :] < window
        return PairLayout([(Queries(query, kv_heads), key.to(torch.float32)), (grouped_query, grouped_key)], [near])
