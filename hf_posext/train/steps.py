"""What one step of the recipe computes: the training loss of a batch, and the held-out evaluation."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from accelerate import Accelerator

from .blocks import packed_batch, take_blocks
from .loss import causal_lm_loss
from .sequence_parallel import group_mean_loss, shard_sequence


def forward_loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    pose: bool = False,
    accelerator: Accelerator | None = None,
    loss_chunk_size: int = 0,
    shift_labels: torch.Tensor | None = None,
    sequence_parallel: tuple[int, int, Any] | None = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy of ``input_ids`` ``[batch, seq]`` at ``position_ids``.

    Labels are shifted here rather than inside the model, so that context parallelism can shard
    inputs and labels alike (accelerate's CP guide); the last position has no target.
    ``shift_labels`` (already shifted, ``-100`` where no target) replaces them: packed short
    documents (blocks.document_labels), whose restarting ``position_ids`` transformers reads as
    separate sequences (no attention mask is passed unless ``pose``).
    ``loss_chunk_size > 0`` computes the same loss without all logits (see loss.py).
    ``sequence_parallel``: ``(rank, size, group)``: this process scores its slice of the sequence and
    the mean is the group's (sequence_parallel.py).
    """
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(input_ids[:, 1:], (0, 1), value=-100)
    if sequence_parallel is not None:
        rank, size, group = sequence_parallel
        input_ids, position_ids, shift_labels = (
            shard_sequence(t, rank, size) for t in (input_ids, position_ids, shift_labels)
        )
        local = forward_loss(model, input_ids, position_ids, pose, accelerator, loss_chunk_size, shift_labels)
        return group_mean_loss(local, (shift_labels != -100).sum(), group)
    kwargs: dict[str, Any] = {}
    if pose:
        # Skipped positions would otherwise be read as packed-sequence boundaries (see pose.py).
        kwargs["attention_mask"] = torch.ones_like(input_ids)
    # The chunked loss applies the LM head outside the model's forward: under the same autocast as
    # the forward (accelerate wraps only ``model.forward``), so it matches the model's own logits.
    autocast = accelerator.autocast() if accelerator is not None else contextlib.nullcontext()
    buffers = [input_ids, position_ids, shift_labels]
    cp = (
        accelerator is not None
        and accelerator.parallelism_config is not None
        and accelerator.parallelism_config.cp_enabled
    )
    with autocast:
        if cp:
            with accelerator.maybe_context_parallel(
                buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)
            ):
                return _loss(model, input_ids, position_ids, shift_labels, loss_chunk_size, kwargs)
        return _loss(model, input_ids, position_ids, shift_labels, loss_chunk_size, kwargs)


def _loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    shift_labels: torch.Tensor,
    loss_chunk_size: int,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    if loss_chunk_size:
        return causal_lm_loss(model, input_ids, position_ids, shift_labels, loss_chunk_size, **kwargs)
    return model(
        input_ids=input_ids,
        position_ids=position_ids,
        labels=shift_labels,
        shift_labels=shift_labels,
        use_cache=False,
        **kwargs,
    ).loss


def check_finite_loss(loss: torch.Tensor, step: int, accelerator: Accelerator | None = None) -> None:
    """Raise before a non-finite micro-batch loss is back-propagated, on every process alike.

    Nothing of the step is applied or saved then: a NaN step would otherwise poison the weights,
    and the run would write them (training states and the final model) and exit 0.

    Raises:
        ValueError: naming the step (1-based) and the loss.
    """
    bad = ~torch.isfinite(loss.detach()).all()
    if accelerator is not None and accelerator.num_processes > 1:  # every process stops, none waits in backward
        bad = accelerator.reduce(bad.float(), reduction="sum") > 0
    if bool(bad):
        raise ValueError(
            f"step {step}: the training loss is {float(loss.detach().float().mean())} (on this or another process); "
            "stopped before it was applied, nothing of this step saved: lower learning_rate, use "
            "mixed_precision=no or fp32 weights, or check the data and the method's settings"
        )


@torch.no_grad()
def evaluate(
    model: nn.Module,
    blocks: np.ndarray,
    accelerator: Accelerator,
    dp_size: int,
    dp_rank: int,
    micro_batch_size: int = 1,
) -> dict[str, float]:
    """Mean loss and perplexity of ``blocks``, over all processes: the mean of each block's mean target loss.

    Token blocks ``[blocks, len]`` are scored at contiguous positions; packed documents ``[blocks, 3, len]``
    (``packing``: blocks.load_document_blocks) each at its own positions on its own targets, as they train.
    Every process runs the same number of forwards (sharded models need that); the padding repeats a block
    with weight 0, as does a block without a target.
    """
    model.eval()
    count = len(blocks)
    per_rank = math.ceil(count / dp_size)
    total = torch.zeros(2, device=accelerator.device, dtype=torch.float64)
    for start in range(0, per_rank, micro_batch_size):
        slots = [dp_rank * per_rank + i for i in range(start, min(start + micro_batch_size, per_rank))]
        indices = [slot % count for slot in slots]
        if blocks.ndim == 3:
            input_ids, positions, labels = packed_batch(blocks, indices, accelerator.device)
        else:
            input_ids = take_blocks(blocks, indices).to(accelerator.device)
            positions = torch.arange(input_ids.shape[1], device=accelerator.device).expand_as(input_ids)
            labels = torch.nn.functional.pad(input_ids[:, 1:], (0, 1), value=-100)
        with accelerator.autocast():
            logits = model(input_ids=input_ids, position_ids=positions, use_cache=False).logits.float()
        targets = (labels != -100).sum(dim=1)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none").sum(dim=1)
        nll = nll / targets.clamp(min=1)
        weight = torch.tensor([float(slot < count) for slot in slots], device=nll.device, dtype=torch.float64)
        weight = weight * (targets > 0).to(weight.device, torch.float64)
        total += torch.stack([(nll.double() * weight).sum(), weight.sum()])
    total = accelerator.reduce(total, reduction="sum")
    model.train()
    loss = float(total[0] / total[1])
    return {"loss": loss, "perplexity": math.exp(loss)}
