"""Sequence parallelism in the recipe (``sp_size``): DeepSpeed Ulysses, driven by accelerate.

accelerate (``ParallelismConfig(sp_backend="deepspeed", sp_size=N)`` under a DeepSpeed config)
wraps the model's attention function with Ulysses' all-to-all in ``prepare``: each of N processes
holds a slice of the sequence, attention runs over all positions for H/N heads. The recipe does
what accelerate's DataLoader adapter would: each process takes its slice of the input ids,
positions and shifted labels (`shard_sequence`), and the loss is the group's mean over all
its tokens (`group_mean_loss`). Every family works under head sharding (ALiBi's slopes follow
the heads a process holds, `hf_posext.attention.head_sharding`; the remapping and exact
dynamic kernels read the gathered positions; LongRoPE's factor set is the one the whole sequence takes,
pinned on every micro-batch by the loop, where a slice would pick by its own length); what cannot work is
refused (`check_sequence_parallel`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_gather

from .. import integration
from ..attention.head_sharding import shard_heads
from ..methods import method_config
from .config import TrainConfig


def check_sequence_parallel(config: TrainConfig, model: nn.Module, sp_size: int, window: int) -> None:
    """Refuse, naming it and why, what sequence parallelism over ``sp_size`` processes cannot run.

    Raises:
        ValueError: heads the processes do not divide; the eager kernel (Ulysses drops the mask,
            and eager without one is not causal); packed short documents (``short_fraction``: the
            dropped mask kept them apart); transformers' own dynamic scaling (``exact_cache=False``:
            each process would scale by the length of its slice); a window the processes do not divide.
    """
    text = model.config.get_text_config()
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if heads % sp_size or (kv_heads % sp_size and sp_size % kv_heads):
        raise ValueError(
            f"sp_size={sp_size} must divide the {heads} attention heads, and divide or be a multiple of the "
            f"{kv_heads} key/value heads (Ulysses hands each process heads / sp_size of them)"
        )
    if config.attn_implementation == "eager":
        raise ValueError(
            "sp_size > 1 with attn_implementation='eager': DeepSpeed Ulysses drops the attention mask, and the eager "
            "kernel without one is not causal; use attn_implementation='sdpa' (or flash_attention_2)"
        )
    if config.packing:
        raise ValueError(
            "packing with sp_size > 1: packed documents are kept apart by the attention mask, which DeepSpeed "
            "Ulysses drops (they would attend across documents); set packing=False for sequence parallelism"
        )
    if config.short_fraction > 0:
        raise ValueError(
            f"short_fraction={config.short_fraction:g} with sp_size > 1: packed short documents are kept apart by "
            "the attention mask, which DeepSpeed Ulysses drops; set short_fraction=0 for sequence parallelism"
        )
    method = method_config(config.method, factor=config.factor, **config.method_arguments)
    if getattr(method, "exact_cache", True) is False:
        raise ValueError(
            f"{config.method} with exact_cache=False under sp_size > 1: transformers' own length-dependent rope "
            "scales each process's slice by the slice's length, not the sequence's; keep exact_cache=True (default)"
        )
    if config.eval_blocks:
        raise ValueError(
            f"eval_blocks={config.eval_blocks} with sp_size > 1: the held-out evaluation scores whole sequences on "
            "each process, which Ulysses' fixed slices do not take; set eval_blocks=0 and evaluate the saved checkpoint"
        )
    if window % sp_size:
        raise ValueError(f"sp_size={sp_size} must divide the {window}-token training sequence (each takes a slice)")


def setup_sequence_parallel(accelerator: Any, model: nn.Module, window: int) -> tuple[int, int]:
    """Tell the model and accelerate's Ulysses settings what this run is; ``(sp_rank, sp_size)``.

    The attention function accelerate wraps is the one the patched model selects (hf-posext's
    wrappers register their own names), for ``window`` tokens per sequence. DeepSpeed's groups are
    consecutive ranks (``parallel_state_sp.initialize_sequence_parallel``).
    """
    pc = accelerator.parallelism_config
    size = pc.sp_size
    rank = accelerator.process_index % size
    pc.sp_handler.sp_attn_implementation = integration.attention_implementation(model.config)
    pc.sp_handler.sp_seq_length = window
    pc.sp_handler.sp_seq_length_is_variable = False
    shard_heads(model, rank, size)
    return rank, size


def shard_sequence(tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Process ``rank``'s slice of ``[batch, seq]`` along the sequence (the tokens it embeds and scores)."""
    chunk = tensor.shape[1] // size
    return tensor[:, rank * chunk : (rank + 1) * chunk]


def sequence_parallel_group() -> Any:
    """This process's sequence-parallel group, once accelerate's ``prepare`` has made DeepSpeed's."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    return parallel_state_sp.get_sequence_parallel_group()


def group_mean_loss(local_mean: torch.Tensor, local_count: torch.Tensor, group: Any) -> torch.Tensor:
    """The mean loss over every token of a sequence-parallel group, from each process's mean over its own.

    Gathered with a differentiable all-gather, so every process holds the group's loss and its
    backward reaches the tokens of the others through Ulysses' all-to-all; averaging the gradients
    over the processes (DeepSpeed's reduction) then gives the gradient of the group's loss.
    """
    total = torch.where(local_count > 0, local_mean * local_count, torch.zeros_like(local_mean))
    sums = all_gather(total, group=group)
    counts = [torch.empty_like(local_count) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, local_count, group=group)
    return torch.stack(list(sums)).sum() / torch.stack(counts).sum()
