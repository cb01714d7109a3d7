"""What each micro-batch of a run holds: long or short, its window, positions and labels, what the method pins.

Every choice is a function of the data position (micro-batches consumed) and the optimizer step,
never of the process or the clock: a resumed run gets the micro-batches an uninterrupted one
would, and a step's micro-batches have one shape on every process (docs/notes/training.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from ..methods import training_for
from .blocks import micro_batch_indices, packed_batch, take_blocks
from .config import TrainConfig
from .plan import Plan
from .pose import pose_position_ids


def shorts_before(micro_step: int, short_fraction: float) -> int:
    """Short micro-batches among the first ``micro_step`` (``short_fraction`` of them, evenly spread).

    Micro-batch ``k`` is short when this count grows from ``k`` to ``k + 1``; every process
    counts the same, so a step's micro-batches have one length on all of them.
    """
    return math.floor(micro_step * Fraction(str(short_fraction)))


@dataclass(frozen=True)
class MicroBatch:
    """One forward's inputs.

    Attributes:
        input_ids: ``[batch, seq]`` token ids.
        positions: ``[batch or 1, seq]`` position ids.
        labels: ``[batch, seq]`` shifted targets (``-100``: none) of packed short documents, else ``None``
            (the next token of the same row).
        short: whole short documents (the long/short mix), not a long sample.
        pin: what the method pins the forward and backward to (`hf_posext.methods.training.Training.pin_for`:
            LongRoPE's factor set, ``"short"`` or ``"long"``); ``None``: nothing.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor | None
    short: bool
    pin: Hashable | None


class MicroBatches:
    """This process's micro-batches from data position ``micro_step`` on (`next`).

    Args:
        config: the run's settings.
        plan: its lengths, processes and window schedule.
        train_blocks: ``[blocks, plan.window]`` token ids of the long side, or ``[blocks, 3, plan.window]``
            packed documents with ``packing`` (ids, document numbers, targets: blocks.load_document_blocks).
        short_blocks: ``[blocks, 3, plan.short_len]`` packed short documents (ids, document numbers, targets), or
            ``None`` without the long/short mix.
        device: where the tensors go.
        micro_step: micro-batches consumed before (a resumed run's data position).
    """

    def __init__(
        self,
        config: TrainConfig,
        plan: Plan,
        train_blocks: np.ndarray,
        short_blocks: np.ndarray | None,
        device: Any,
        micro_step: int = 0,
    ) -> None:
        self.config, self.plan, self.device = config, plan, device
        self.training, self.options = training_for(config.method), config.training_options
        self.train_blocks, self.short_blocks = train_blocks, short_blocks
        shorts = shorts_before(micro_step, config.short_fraction)
        batch, dp = config.micro_batch_size, (plan.dp_size, plan.dp_rank)
        self.long_order = micro_batch_indices(len(train_blocks), batch, *dp, config.seed, start=micro_step - shorts)
        self.short_order = None
        if short_blocks is not None:
            self.short_order = micro_batch_indices(len(short_blocks), batch, *dp, config.seed, start=shorts)

    def is_short(self, micro_step: int) -> bool:
        """Whether micro-batch ``micro_step`` (0-based, over the whole run) holds short documents."""
        fraction = self.config.short_fraction
        return shorts_before(micro_step + 1, fraction) > shorts_before(micro_step, fraction)

    def next(self, step: int, micro_step: int) -> MicroBatch:
        """The next micro-batch: number ``micro_step`` of the run, part of optimizer step ``step`` (both 0-based)."""
        config, plan, device = self.config, self.plan, self.device
        if self.short_blocks is not None and self.short_order is not None and self.is_short(micro_step):
            input_ids, positions, labels = packed_batch(self.short_blocks, next(self.short_order), device)
            return MicroBatch(input_ids, positions, labels, True, self.pin_for(plan.short_len))
        window = plan.window_at(step)
        if self.train_blocks.ndim == 3:  # packing: whole documents, as the short side's
            input_ids, positions, labels = packed_batch(self.train_blocks, next(self.long_order), device, window)
            return MicroBatch(input_ids, positions, labels, False, self.pin_for(window))
        # The schedule's window is the start of the block (cut at the full window): the data position stays
        # one integer, and a longer window later reads the same blocks further.
        input_ids = take_blocks(self.train_blocks, next(self.long_order))[:, :window].to(device)
        if config.pose:
            # Seeded by the micro-batch's place in the global batch (the data position): a resumed run
            # draws the same positions, and N processes those of one process accumulating the same
            # global batch (one process: micro_step itself, the seeds of runs made before).
            place = micro_step * plan.dp_size + plan.dp_rank
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + place * 4099)
            positions = pose_position_ids(
                window, plan.seq_len, config.pose_chunks, batch_size=input_ids.shape[0], generator=generator
            ).to(device)
            return MicroBatch(input_ids, positions, None, False, self.pin_for(plan.seq_len))
        # One row broadcast over the batch, as transformers does without position ids.
        positions = torch.arange(window, device=device).unsqueeze(0)
        return MicroBatch(input_ids, positions, None, False, self.pin_for(window))

    def pin_for(self, length: int) -> Hashable | None:
        """What the method pins a micro-batch that stands for a sequence of ``length`` tokens to (``None``: nothing).

        A PoSE sample stands for a sequence of ``seq_len`` tokens, whatever its largest position; the
        method's `hf_posext.methods.training.Training.pin_for` decides (LongRoPE: its factor set).
        """
        return self.training.pin_for(self.options, length=length, original_context=self.plan.original_context)
