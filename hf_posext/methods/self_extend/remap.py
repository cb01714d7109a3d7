"""Self-Extend's positions as pieces of :func:`hf_posext.attention.remap.segmented_attention`.

For a block of at most W query rows ``[a, b)`` (key columns, causal) keys ``j <= a - W`` are
grouped for every row, keys ``j > b - 1 - W`` are neighbours for every row (the block's own keys
``[a, b)`` a causal square), and the ``b - a - 1`` columns in between are chosen per pair
(``i - j < W``: neighbour), as LongLM's selection merge.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ...attention.remap import PairLayout, Piece, block_rows, group_queries, rotate_by


class SelfExtendRemapping:
    """Self-Extend with group size ``group`` and neighbour window ``window``."""

    name = "self_extend"

    def __init__(self, group: int, window: int) -> None:
        self.group, self.window = group, window

    def active(self, last_position: int) -> bool:
        return self.group > 1 and last_position >= self.window

    def layout(self, query: torch.Tensor, key: torch.Tensor, past: int, offset: int,
               inv_freq: torch.Tensor) -> _Layout:
        return _Layout(self, query, key, past, offset, inv_freq)

    def positioned_layout(self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor,
                          inv_freq: torch.Tensor) -> PairLayout:
        """Every pair chooses by its positions' distance ``i - j < W``."""
        group, window = self.group, self.window
        positions = positions[None]
        kv_heads = key.shape[1]
        grouped_query = rotate_by(query, positions.div(group, rounding_mode="floor") + window - window // group
                                  - positions, inv_freq)
        grouped_key = rotate_by(key, positions.div(group, rounding_mode="floor") - positions, inv_freq)
        near = positions[0, :, None] - positions[0, None, :] < window
        return PairLayout([(group_queries(query.to(torch.float32), kv_heads), key.to(torch.float32)),
                           (group_queries(grouped_query, kv_heads), grouped_key)], [near])


class _Layout:
    def __init__(self, remap: SelfExtendRemapping, query: torch.Tensor, key: torch.Tensor, past: int, offset: int,
                 inv_freq: torch.Tensor) -> None:
        group, window = remap.group, remap.window
        rows, kv_heads, kv_len, _ = key.shape
        device = query.device
        key_pos = (torch.arange(kv_len, device=device) + offset).expand(rows, kv_len)
        query_pos = key_pos[:, past:]
        grouped_query = query_pos.div(group, rounding_mode="floor") + window - window // group
        self.window, self.past = window, past
        self.query = group_queries(query.to(torch.float32), kv_heads)
        self.key = key.to(torch.float32)
        self.grouped_query = group_queries(rotate_by(query, grouped_query - query_pos, inv_freq), kv_heads)
        self.grouped_key = rotate_by(key, key_pos.div(group, rounding_mode="floor") - key_pos, inv_freq)

    def blocks(self, past: int, seq: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
        size = min(size, self.window)  # then a block's mixed columns all precede its own keys
        for start in range(0, seq, size):
            yield start, min(seq, start + size)

    def pieces(self, start: int, stop: int) -> list[Piece]:
        a, b, window = self.past + start, self.past + stop, self.window
        far = max(0, min(a - window + 1, b))
        mixed = max(far, b - window)
        pieces = []
        if far > 0:
            pieces.append(Piece(0, far, block_rows(self.grouped_query, start, stop), self.grouped_key[:, :, :far]))
        if mixed > far:
            rows = torch.arange(a, b, device=self.key.device)[:, None]
            near = rows - torch.arange(far, mixed, device=self.key.device)[None, :] < window
            pieces.append(Piece(far, mixed, block_rows(self.query, start, stop), self.key[:, :, far:mixed],
                                other=(block_rows(self.grouped_query, start, stop), self.grouped_key[:, :, far:mixed]),
                                first=near))
        if a > mixed:
            pieces.append(Piece(mixed, a, block_rows(self.query, start, stop), self.key[:, :, mixed:a]))
        pieces.append(Piece(a, b, block_rows(self.query, start, stop), self.key[:, :, a:b], causal=True))
        return pieces
