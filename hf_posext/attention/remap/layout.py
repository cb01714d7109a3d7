"""Where remapped attention's score segments are: the pieces of each query block, and the rotation that remaps them.

In transformers 5 an attention function receives queries and keys already rotated at their true
positions. A method that scores some (query, key) pairs at other positions turns them further by
the difference, ``R(p' theta) x = R((p' - p) theta) R(p theta) x`` (`rotate_by`, fp32); the
rotary module's attention factor is already in q and k, so it is counted once. A method's
`Layout` splits each block of query rows into column `Piece` s, each scored by one
(query, key) variant or by two or three variants chosen per pair. The kernels that score the
pieces (`attention`'s score path, `flash_segments`'s fused path) read only these; the
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


class Queries:
    """One query variant, made block by block as the pieces ask for it: the kernel's queries, scaled and turned.

    A variant holds the kernel's queries, not a turned copy: its memory is one block's rows (DCA
    has three variants; an fp32 copy of a bf16 model's queries alone is twice their size).

    Args:
        query: ``[rows, heads, seq, d]`` as the kernel receives them.
        kv_heads: key heads; the queries of one key head are grouped (GQA without repeating keys).
        delta: ``[rows, seq]`` positions to turn each query by (`rotate_by`); ``None``: as they are.
        inv_freq: the rotary frequencies, with ``delta``.
        scale: multiplies the queries first: a float, or ``[rows, seq]`` per query.
    """

    def __init__(
        self,
        query: torch.Tensor,
        kv_heads: int,
        delta: torch.Tensor | None = None,
        inv_freq: torch.Tensor | None = None,
        scale: float | torch.Tensor | None = None,
    ) -> None:
        if delta is not None and inv_freq is None:
            raise ValueError("Queries turned by delta need the rotary inv_freq")
        self.query, self.kv_heads, self.delta, self.inv_freq, self.scale = query, kv_heads, delta, inv_freq, scale

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` as ``[rows, kv_heads, groups * (stop - start), d]`` float32, group by group."""
        query = self.query[:, :, start:stop].to(torch.float32)
        if isinstance(self.scale, torch.Tensor):
            query = query * self.scale[:, None, start:stop, None]
        elif self.scale is not None:
            query = query * self.scale
        if self.delta is not None and self.inv_freq is not None:
            query = rotate_by(query, self.delta[:, start:stop], self.inv_freq)
        rows, heads, block, dim = query.shape
        return query.reshape(rows, self.kv_heads, heads // self.kv_heads * block, dim)


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

    Each variant is a (`Queries`, keys ``[rows, kv_heads, kv_len, d]`` float32) pair; the far
    key may be the near one (STRING turns only the query). For a block of at most ``window`` query rows ``[a, b)``
    keys ``j <= a - window`` are far for every row, keys ``j > b - 1 - window`` near for every row (the
    block's own keys a causal square), and the ``b - a - 1`` columns between are chosen per pair
    (``i - j < window``: near), as the authors' selection merge.
    """

    def __init__(
        self, window: int, past: int, near: tuple[Queries, torch.Tensor], far: tuple[Queries, torch.Tensor]
    ) -> None:
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
        near_query = self.query.block(start, stop)
        far_query = self.far_query.block(start, stop) if mixed > 0 else None
        pieces = []
        if far_query is not None and far > 0:
            pieces.append(Piece(0, far, far_query, self.far_key[:, :, :far]))
        if far_query is not None and mixed > far:
            rows = torch.arange(a, b, device=self.key.device)[:, None]
            near = rows - torch.arange(far, mixed, device=self.key.device)[None, :] < window
            pieces.append(
                Piece(
                    far,
                    mixed,
                    near_query,
                    self.key[:, :, far:mixed],
                    other=(far_query, self.far_key[:, :, far:mixed]),
                    first=near,
                )
            )
        if a > mixed:
            pieces.append(Piece(mixed, a, near_query, self.key[:, :, mixed:a]))
        pieces.append(Piece(a, b, near_query, self.key[:, :, a:b], causal=True))
        return pieces


class PairLayout:
    """A `Layout` where every pair picks its variant by its own positions (two or three variants).

    Args:
        variants: (`Queries`, keys ``[1, kv_heads, seq, d]`` float32) pairs.
        choices: ``[seq, seq]`` bool masks: ``choices[0]`` picks the first variant, ``choices[1]``
            (with three variants) the second among the rest.
    """

    def __init__(self, variants: list[tuple[Queries, torch.Tensor]], choices: list[torch.Tensor]) -> None:
        self.variants, self.choices = variants, choices

    def blocks(self, past: int, seq: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
        for start in range(0, seq, size):
            yield start, min(seq, start + size)

    def pieces(self, start: int, stop: int) -> list[Piece]:
        (q0, k0), (q1, k1), *rest = self.variants
        third = (rest[0][0].block(start, stop), rest[0][1][:, :, :stop]) if rest else None
        return [
            Piece(
                0,
                stop,
                q0.block(start, stop),
                k0[:, :, :stop],
                other=(q1.block(start, stop), k1[:, :, :stop]),
                first=self.choices[0][start:stop, :stop],
                third=third,
                second=self.choices[1][start:stop, :stop] if rest else None,
            )
        ]


def positioned_split(
    window: int, positions: torch.Tensor, near: tuple[Queries, torch.Tensor], far: tuple[Queries, torch.Tensor]
) -> PairLayout:
    """`SplitLayout`'s rule for tokens at any increasing ``positions`` ``[seq]``: near if ``i - j < window``."""
    return PairLayout([near, far], [positions[:, None] - positions[None, :] < window])
