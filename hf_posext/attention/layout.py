"""Where remapped attention's score segments are: the pieces of each query block, and the rotation that remaps them.

In transformers 5 an attention function receives queries and keys already rotated at their true
positions. A method that scores some (query, key) pairs at other positions turns them further by
the difference, ``R(p' theta) x = R((p' - p) theta) R(p theta) x`` (:func:`rotate_by`, fp32); the
rotary module's attention factor is already in q and k, so it is counted once. A method's
:class:`Layout` splits each block of query rows into column :class:`Piece` s, each scored by one
(query, key) variant or by two or three variants chosen per pair. The kernels that score the
pieces (:mod:`.remap`'s score path, :mod:`.flash_segments`'s fused path) read only these; the
maths is in ``docs/methods/training_free.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch


def rotate_by(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Turn already-rotated ``x`` by ``delta`` more positions, rotate-half pairing, in fp32.

    Args:
        x: ``[batch, heads, seq, head_dim]``; channels past ``2 * len(inv_freq)`` are passed through.
        delta: ``[batch, seq]`` position differences (integers).
        inv_freq: ``[rotary_dim // 2]`` the rotary module's frequencies.

    Returns:
        ``[batch, heads, seq, head_dim]`` float32.
    """
    half = inv_freq.shape[0]
    angles = delta.to(torch.float32)[:, None, :, None] * inv_freq.to(device=x.device, dtype=torch.float32)
    cos, sin = angles.cos(), angles.sin()
    x = x.to(torch.float32)
    first, second = x[..., :half], x[..., half : 2 * half]
    turned = (first * cos - second * sin, second * cos + first * sin)
    return torch.cat((*turned, x[..., 2 * half :]), dim=-1) if 2 * half < x.shape[-1] else torch.cat(turned, dim=-1)


@dataclass
class Piece:
    """Keys ``[start, stop)`` of one query block, scored by ``query . key``, or per pair by one of two variants.

    ``query`` is ``[rows, kv_heads, groups * block, head_dim]``, ``key`` ``[rows, kv_heads, keys, head_dim]``
    (already sliced to the piece). With ``other`` set, a pair scores ``query . key`` where
    ``first`` (``[block, stop - start]`` bool) is True and ``other[0] . other[1]`` elsewhere.
    """

    start: int
    stop: int
    query: torch.Tensor
    key: torch.Tensor
    other: tuple[torch.Tensor, torch.Tensor] | None = None
    first: torch.Tensor | None = None
    #: The block's own keys (``stop - start`` = rows): causal, top-left aligned.
    causal: bool = False
    #: A third variant: where ``first`` is False, ``other`` scores where ``second`` is True, ``third`` elsewhere.
    third: tuple[torch.Tensor, torch.Tensor] | None = None
    second: torch.Tensor | None = None


class Layout(Protocol):
    """Where a method's score segments are, for the rows of a batch that share one position offset."""

    def blocks(self, past: int, seq: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
        """Query row ranges ``[start, stop)`` (0-based among the new tokens) of at most ``size`` rows."""
        ...

    def pieces(self, start: int, stop: int) -> list[Piece]:
        """The pieces of query rows ``[start, stop)``, covering keys ``[0, past + stop)`` in order."""
        ...


class SplitLayout:
    """Pairs closer than ``window`` score ``near``, farther ones ``far``: Self-Extend, STRING, ReRoPE.

    Each variant is a (query, key) pair of tensors, queries as :func:`group_queries` gives them
    (``[rows, kv_heads, groups, seq, d]``), keys ``[rows, kv_heads, kv_len, d]``; the far key may be
    the near one (STRING turns only the query). For a block of at most ``window`` query rows ``[a, b)``
    keys ``j <= a - window`` are far for every row, keys ``j > b - 1 - window`` near for every row (the
    block's own keys a causal square), and the ``b - a - 1`` columns between are chosen per pair
    (``i - j < window``: near), as the authors' selection merge.
    """

    def __init__(self, window: int, past: int, near: tuple[torch.Tensor, torch.Tensor],
                 far: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.window, self.past = window, past
        self.query, self.key = near
        self.far_query, self.far_key = far

    def blocks(self, past: int, seq: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
        size = min(size, self.window)  # then a block's mixed columns all precede its own keys
        for start in range(0, seq, size):
            yield start, min(seq, start + size)

    def pieces(self, start: int, stop: int) -> list[Piece]:
        a, b, window = self.past + start, self.past + stop, self.window
        far = max(0, min(a - window + 1, b))
        mixed = max(far, b - window)
        near_query = block_rows(self.query, start, stop)
        pieces = []
        if far > 0:
            pieces.append(Piece(0, far, block_rows(self.far_query, start, stop), self.far_key[:, :, :far]))
        if mixed > far:
            rows = torch.arange(a, b, device=self.key.device)[:, None]
            near = rows - torch.arange(far, mixed, device=self.key.device)[None, :] < window
            pieces.append(Piece(far, mixed, near_query, self.key[:, :, far:mixed],
                                other=(block_rows(self.far_query, start, stop), self.far_key[:, :, far:mixed]),
                                first=near))
        if a > mixed:
            pieces.append(Piece(mixed, a, near_query, self.key[:, :, mixed:a]))
        pieces.append(Piece(a, b, near_query, self.key[:, :, a:b], causal=True))
        return pieces


class PairLayout:
    """A :class:`Layout` where every pair picks its variant by its own positions (two or three variants).

    Args:
        variants: ``(query, key)`` pairs, queries as :func:`group_queries` gives them
            ``[1, kv_heads, groups, seq, d]``, keys ``[1, kv_heads, seq, d]``.
        choices: ``[seq, seq]`` bool masks: ``choices[0]`` picks the first variant, ``choices[1]``
            (with three variants) the second among the rest.
    """

    def __init__(self, variants: list[tuple[torch.Tensor, torch.Tensor]], choices: list[torch.Tensor]) -> None:
        self.variants, self.choices = variants, choices

    def blocks(self, past: int, seq: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
        for start in range(0, seq, size):
            yield start, min(seq, start + size)

    def pieces(self, start: int, stop: int) -> list[Piece]:
        (q0, k0), (q1, k1), *rest = self.variants
        third = (block_rows(rest[0][0], start, stop), rest[0][1][:, :, :stop]) if rest else None
        return [Piece(0, stop, block_rows(q0, start, stop), k0[:, :, :stop],
                      other=(block_rows(q1, start, stop), k1[:, :, :stop]), first=self.choices[0][start:stop, :stop],
                      third=third, second=self.choices[1][start:stop, :stop] if rest else None)]


def positioned_split(window: int, positions: torch.Tensor, near: tuple[torch.Tensor, torch.Tensor],
                     far: tuple[torch.Tensor, torch.Tensor]) -> PairLayout:
    """:class:`SplitLayout`'s rule for tokens at any increasing ``positions`` ``[seq]``: near when ``i - j < window``."""
    return PairLayout([near, far], [positions[:, None] - positions[None, :] < window])


def group_queries(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[batch, heads, seq, dim]`` -> ``[batch, kv_heads, groups, seq, dim]`` (GQA without repeating keys)."""
    batch, heads, seq, dim = query.shape
    return query.reshape(batch, kv_heads, heads // kv_heads, seq, dim)


def block_rows(query: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of a :func:`group_queries` tensor as ``[batch, kv_heads, groups * block, dim]``."""
    return query[:, :, :, start:stop].flatten(2, 3)
