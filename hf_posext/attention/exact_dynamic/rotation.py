"""Rotation maths of exact dynamic scaling: RoPE on half tables, cos/sin tables, complex rotation grids.

Llama, Mistral and Qwen pair channel i with i + rotary_dim / 2 (transformers' ``rotate_half``);
everything here keeps that convention. Nothing here knows about models or plans.
"""

from __future__ import annotations

import math

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` the way Llama, Mistral and Qwen do: channel i pairs with i + rotary_dim / 2.

    Bit for bit transformers' ``x * cos + rotate_half(x) * sin``, written on the half tables so
    that a decoding step, which re-rotates the whole key cache, makes fewer passes over it.

    Args:
        x: ``[batch, heads, seq, head_dim]``.
        cos, sin: half tables ``[batch or 1, seq, rotary_dim // 2]``; channels past ``rotary_dim``
            are left as they are.

    Returns:
        ``[batch, heads, seq, head_dim]``, same dtype as ``x``.
    """
    return rotate(x, cos.unsqueeze(1), sin.unsqueeze(1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` with tables that already broadcast against ``x`` (last dim rotary_dim // 2)."""
    half = cos.shape[-1]
    first, second = x[..., :half], x[..., half : 2 * half]
    parts = [first * cos - second * sin, second * cos + first * sin]
    if 2 * half < x.shape[-1]:  # the tables may broadcast x to more dims (one copy of the keys per row)
        parts.append(x[..., 2 * half :].expand(*parts[0].shape[:-1], -1))
    return torch.cat(parts, dim=-1)


def cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half cos/sin tables as transformers' rotary modules build them, one frequency set per batch row.

    The angles and the cos/sin are computed in fp32 whatever ``dtype`` (positions beyond 256 are
    not integers in bf16), with the same operations as transformers, then cast. transformers
    duplicates the angles before the cos; the halves hold the same values at half the cost.

    Args:
        positions: ``[batch, seq]`` integer positions.
        inv_freq: ``[batch or 1, rotary_dim // 2]`` fp32 frequencies.
        scaling: ``[batch or 1]`` fp32 cos/sin multiplier (YaRN's mscale), or ``None`` when all are 1.
        dtype: the dtype of the queries and keys.

    Returns:
        ``(cos, sin)``, each ``[batch, seq, rotary_dim // 2]`` in ``dtype``.
    """
    freqs = positions[..., None].float() * inv_freq[:, None, :]
    cos, sin = freqs.cos(), freqs.sin()
    if scaling is not None:  # None: every multiplier is 1 (NTK), and x * 1 == x
        scale = scaling[:, None, None]
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def uses_complex_rotation(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether ``x``'s rotations take the complex-multiply path: fp32 (no complex type rounds like
    bf16/fp16) on CPU or CUDA (other backends' complex support is partial); else `rotate`.

    Not when autograd records ``x`` or any of ``others`` (training): that path writes into scratch
    buffers (``out=``), which autograd refuses; `rotate` is the same maths, differentiable.
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *others)):
        return False
    return x.dtype == torch.float32 and x.device.type in ("cpu", "cuda")


def multipliers(values: list[float], device: torch.device) -> torch.Tensor | None:
    """The cos/sin multipliers as a ``[len(values)]`` fp32 tensor, or ``None`` when all are 1."""
    if all(value == 1.0 for value in values):
        return None
    return torch.tensor(values, dtype=torch.float32, device=device)


def grid_rotations(
    last: torch.Tensor,
    count: int,
    inv_freq: torch.Tensor,
    scaling: torch.Tensor | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``scaling * exp(i * p * inv_freq)`` at the ``count`` positions ``p = last - count + 1 .. last``, complex64.

    A key rotation needs it for every key and frequency, and cos and sin of that many angles cost
    more than the rotation itself. Splitting ``p = last - a B - b`` with ``B`` about
    ``sqrt(count)`` and ``0 <= b < B``, it is the product of ``exp(i (last - a B) inv_freq)`` and
    ``exp(-i b inv_freq)``: cos/sin of about ``2 sqrt(count)`` angles per frequency, then one
    complex multiply per entry. That is one more rounding (~1e-7) than computing each angle
    directly, less than the rounding of the fp32 angles themselves at large positions. The entry
    at ``last`` is computed directly (``b = 0``, ``a = 0``), so offset 0 of a decoding step is
    exactly ``scaling``.

    Args:
        last: ``[batch or 1]`` integer position of the last entry, per batch row.
        count: number of positions.
        inv_freq: ``[batch or 1, *rows, rotary_dim // 2]`` fp32 frequencies (``rows``: none, or
            one dimension of query rows with their own frequencies).
        scaling: ``[batch or 1, *rows]`` fp32 multipliers, or ``None`` for 1.
        out: a flat complex64 buffer to build the grid in (`grid_size` elements), or ``None``.

    Returns:
        ``[batch, *rows, count, rotary_dim // 2]`` complex64 (a view of ``out`` when given).
    """
    return grid_product(grid_factors(last, count, inv_freq, scaling), count, out)


def grid_factors(
    last: torch.Tensor, count: int, inv_freq: torch.Tensor, scaling: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two short tables of `grid_rotations` (same arguments), to be multiplied by `grid_product`.

    Returns:
        ``exp(i (last - a B) inv_freq)`` ``[batch, *rows, A, 1, half]`` and ``scaling * exp(-i b inv_freq)``
        ``[batch or 1, *rows, 1, B, half]``, complex64; ``a`` and ``b`` count down to 0, so that the
        flattened grid ascends to ``last``.
    """
    coarse, fine = _grid_split(count)
    device = inv_freq.device

    def unit(steps: torch.Tensor) -> torch.Tensor:  # exp(i * steps * inv_freq): [..., len(steps), half]
        angles = steps[..., None].float() * inv_freq[..., None, :]
        return torch.complex(angles.cos(), angles.sin())

    rows = (1,) * (inv_freq.dim() - 2)
    coarse_steps = last.to(device).reshape(-1, *rows, 1) - torch.arange(coarse - 1, -1, -1, device=device) * fine
    coarse_part = unit(coarse_steps)  # [batch, *rows, A, half]
    fine_part = unit(torch.arange(1 - fine, 1, device=device))  # [batch or 1, *rows, B, half]
    if scaling is not None:
        fine_part = fine_part * scaling[..., None, None]
    return coarse_part[..., :, None, :], fine_part[..., None, :, :]


def grid_product(
    factors: tuple[torch.Tensor, torch.Tensor], count: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`grid_rotations` from its `grid_factors`: ``[batch, *rows, count, half]``, in ``out`` when given."""
    coarse_part, fine_part = factors
    if out is None:
        table = coarse_part * fine_part
    else:
        shape = torch.broadcast_shapes(coarse_part.shape, fine_part.shape)
        table = torch.mul(coarse_part, fine_part, out=out[: math.prod(shape)].view(shape))
    return table.flatten(-3, -2)[..., table.shape[-3] * table.shape[-2] - count :, :]  # the last `count` of A * B


def _grid_split(count: int) -> tuple[int, int]:
    """``(A, B)`` of `grid_rotations`: B about ``sqrt(count)`` with B * B >= count, A * B >= count."""
    fine = math.isqrt(max(count - 1, 0)) + 1
    return -(-count // fine), fine


def grid_size(count: int) -> int:
    """Positions in `grid_rotations`' grid for ``count`` positions (a buffer holds this many per frequency)."""
    coarse, fine = _grid_split(count)
    return coarse * fine


def interleave(x: torch.Tensor, half: int) -> torch.Tensor:
    """``x``'s rotary channels reordered as (0, half, 1, half + 1, ...): the real view of its complex pairs."""
    return torch.stack((x[..., :half], x[..., half : 2 * half]), dim=-1).flatten(-2)
