"""PoSE: positional skip-wise training (Zhu et al. 2023, arXiv 2309.10400, section 3.2).

Short windows whose chunks get skip biases so relative distances cover the target context
(equation 4); batches pass an explicit attention mask (docs/notes/training.md).
"""

from __future__ import annotations

import torch


def pose_position_ids(
    window: int,
    target_len: int,
    num_chunks: int = 2,
    *,
    batch_size: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Skip-wise position ids for ``batch_size`` samples of ``window`` tokens.

    Args:
        window: tokens per sample, ``L_c``.
        target_len: the context the positions span, ``L_t >= L_c``; every id is ``< L_t``.
        num_chunks: chunks per sample, ``N`` (the paper's default: 2); at most ``window``.
        batch_size: samples, each with its own chunks and skips.
        generator: the random source (seed it for reproducible, resumable runs).

    Returns:
        ``[batch, window]`` int64 position ids, strictly increasing along each row.

    Raises:
        ValueError: ``window > target_len`` or ``num_chunks`` outside ``1 .. window``.
    """
    if window > target_len:
        raise ValueError(f"PoSE window {window} exceeds the target context {target_len}")
    if not 1 <= num_chunks <= window:
        raise ValueError(f"num_chunks must be in 1..{window} (the window), got {num_chunks}")
    max_skip = target_len - window
    rows = []
    for _ in range(batch_size):
        # N - 1 distinct cut points in 1..window-1 give N non-empty contiguous chunks.
        cuts = torch.randperm(window - 1, generator=generator)[: num_chunks - 1] + 1
        bounds = [0, *sorted(cuts.tolist()), window]
        positions = torch.arange(window)
        skip = 0
        for i in range(1, num_chunks):
            skip = int(torch.randint(skip, max_skip + 1, (1,), generator=generator))
            positions[bounds[i] : bounds[i + 1]] += skip
        rows.append(positions)
    return torch.stack(rows)
