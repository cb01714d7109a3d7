"""ALiBi head slopes (Press et al. 2022, arXiv:2108.12409, sec. 3), for any head count.

Powers of two get 2^(-8h/n); other counts follow the reference code's rule (docs/methods/alibi.md),
in closed form, in float64, rounded to fp32 only at the end.
"""

from __future__ import annotations

import math

import torch


def _power_of_two_exponents(count: int) -> list[float]:
    return [-8.0 * h / count for h in range(1, count + 1)]


def alibi_slopes(num_heads: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Press et al.'s slopes for ``num_heads`` heads, ``[heads]``, fp32.

    Args:
        num_heads: the number of *query* heads (with GQA every query head gets its own slope).
        device: where to put the tensor.

    Returns:
        ``[heads]`` slopes m_1 > m_2 > ... (for 8 heads: 1/2, 1/4, ..., 1/256).

    Raises:
        ValueError: if ``num_heads`` is not a positive int.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    power = 2 ** int(math.floor(math.log2(num_heads)))
    exponents = _power_of_two_exponents(power)
    if power != num_heads:
        exponents += _power_of_two_exponents(2 * power)[0::2][: num_heads - power]
    return torch.tensor([2.0**e for e in exponents], dtype=torch.float64).to(device=device, dtype=torch.float32)
