"""Dual Chunk Attention's positions as the pieces of a `hf_posext.attention.remap.layout.Layout`.

With ``c = chunk_size - local_size`` a key at position j sits at ``j mod c``. A query at i scores
the keys of its own chunk at ``i mod c`` (causal), those of the previous chunk at
``min(i mod c + c, chunk_size)`` and all older ones at ``min(2c - 1, chunk_size)`` (ChunkLlama's
``q_states_inter``, vLLM's ``query_inter``). Query blocks never straddle a chunk boundary, so each
block's keys split into three column ranges with one query variant each.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ...attention.remap import PairLayout, Piece, Queries, rotate_by


class DualChunkRemapping:
    """DCA with ``chunk_size`` and ``local_size`` (chunk length ``c = chunk_size - local_size``)."""

    name = "dca"

    def __init__(self, chunk_size: int, local_size: int) -> None:
        self.chunk_size, self.local_size = chunk_size, local_size
        self.chunk = chunk_size - local_size

    def active(self, last_position: int) -> bool:
        return last_position >= self.chunk

    def layout(self, query: torch.Tensor, key: torch.Tensor, past: int, offset: int, inv_freq: torch.Tensor) -> _Layout:
        return _Layout(self, query, key, past, offset, inv_freq)

    def positioned_layout(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> PairLayout:
        """Every pair chooses by its positions' chunks: the same (intra), the previous (successive), older (inter)."""
        chunk, size = self.chunk, self.chunk_size
        positions = positions[None]
        kv_heads = key.shape[1]
        within = positions.remainder(chunk)
        targets = (within, (within + chunk).clamp(max=size), torch.full_like(within, min(2 * chunk - 1, size)))
        shared = rotate_by(key, within - positions, inv_freq)
        chunks = positions[0].div(chunk, rounding_mode="floor")
        relation = chunks[:, None] - chunks[None, :]
        return PairLayout(
            [(Queries(query, kv_heads, target - positions, inv_freq), shared) for target in targets],
            [relation == 0, relation == 1],
        )


class _Layout:
    def __init__(
        self,
        remap: DualChunkRemapping,
        query: torch.Tensor,
        key: torch.Tensor,
        past: int,
        offset: int,
        inv_freq: torch.Tensor,
    ) -> None:
        chunk, size = remap.chunk, remap.chunk_size
        rows, kv_heads, kv_len, _ = key.shape
        key_pos = (torch.arange(kv_len, device=query.device) + offset).expand(rows, kv_len)
        query_pos = key_pos[:, past:]
        within = query_pos.remainder(chunk)
        self.chunk, self.past, self.offset = chunk, past, offset
        self.intra = Queries(query, kv_heads, within - query_pos, inv_freq)
        self.succ = Queries(query, kv_heads, (within + chunk).clamp(max=size) - query_pos, inv_freq)
        self.inter = Queries(query, kv_heads, min(2 * chunk - 1, size) - query_pos, inv_freq)
        self.key = rotate_by(key, key_pos.remainder(chunk) - key_pos, inv_freq)

    def blocks(self, past: int, seq: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
        start = 0
        while start < seq:
            to_boundary = self.chunk - (past + start + offset) % self.chunk
            stop = min(seq, start + size, start + to_boundary)
            yield start, stop
            start = stop

    def pieces(self, start: int, stop: int) -> list[Piece]:
        b = self.past + stop
        own = (self.past + start + self.offset) // self.chunk * self.chunk - self.offset
        own_start, previous_start = max(0, own), max(0, own - self.chunk)
        pieces = []
        if previous_start > 0:
            pieces.append(Piece(0, previous_start, self.inter.block(start, stop), self.key[:, :, :previous_start]))
        if own_start > previous_start:
            pieces.append(
                Piece(previous_start, own_start, self.succ.block(start, stop), self.key[:, :, previous_start:own_start])
            )
        a = self.past + start
        intra = self.intra.block(start, stop)
        if a > own_start:
            pieces.append(Piece(own_start, a, intra, self.key[:, :, own_start:a]))
        pieces.append(Piece(a, b, intra, self.key[:, :, a:b], causal=True))
        return pieces
