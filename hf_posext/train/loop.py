"""The fine-tune loop: patch -> data -> train -> save, through accelerate on one or many devices.

:func:`train` runs the YaRN recipe (arXiv 2309.00071, section 4) for any registered position
method. The same code runs on a laptop CPU, one GPU, DDP, FSDP2, DeepSpeed ZeRO-3 and FSDP2
with context parallelism; the distribution strategy comes from the ``accelerate launch``
config (examples/accelerate/*.yaml), never from this module.

What it guarantees:

* every bad setting, a missing dataset, a sequence longer than the patched model takes, an
  unknown method and LoRA targets the model lacks fail before the first optimizer step;
* ``checkpointing_steps`` saves model, optimizer, scheduler, every process's RNG and the data
  position atomically; a run resumed from step ``k`` ends with the weights an uninterrupted run
  reaches (bit for bit in fp32 on CPU, where kernels are deterministic);
* the final checkpoint (safetensors, config with the extended rope parameters, tokenizer, model
  card, ``train_results.json``) is written to a temporary folder and renamed into place; LoRA
  runs are merged, so it loads in vanilla transformers (:mod:`.export`).

Library use (``scripts/finetune.py`` is a thin wrapper)::

    from hf_posext.train.config import TrainConfig
    from hf_posext.train.loop import train
    result = train(TrainConfig(model="out/tiny-llama", method="yarn", factor=4,
                               dataset=["notes.txt"], output_dir="out/tiny-yarn"))
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import DistributedType, is_bf16_available, set_seed
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..data import check_dataset, is_local_dataset
from ..gguf import resolve_model_source
from .blocks import load_blocks, micro_batch_indices, take_blocks
from ..patching import patch_model
from ..readers import print_engine_warning
from ..validation import check_weight_files, read_config
from .checkpointing import TrainProgress, check_resumable, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import TrainConfig, build_scheduler
from .export import check_final_output, save_dtype_for, save_final
from .lora import apply_lora, check_lora_targets
from .loss import causal_lm_loss
from .plan import plan_run
from .pose import pose_position_ids

#: Settings that must not change between a run and its resumption (they change the result).
RESUME_INVARIANTS = (
    "model", "method", "factor", "dataset", "dataset_split", "text_field", "seq_len", "max_train_steps",
    "learning_rate", "lr_scheduler", "lr_scheduler_kwargs", "warmup_steps", "global_batch_size",
    "micro_batch_size", "lora", "lora_rank", "lora_alpha", "lora_target_modules", "pose", "pose_window",
    "pose_chunks", "eval_blocks", "seed", "method_kwargs",
)

StepCallback = Callable[[TrainProgress], None]


@dataclass
class TrainResult:
    """What a finished run produced.

    Attributes:
        output_dir: the final checkpoint folder.
        steps: optimizer steps taken in total (over all resumptions).
        tokens: training tokens seen in total.
        final_loss: mean training loss of the last step.
        losses: mean training loss of every step.
        eval: held-out loss and perplexity before and after training (``eval_blocks > 0``).
        model: the trained model on this process (a PEFT model for LoRA runs), for inspection.
    """

    output_dir: Path
    steps: int
    tokens: int
    final_loss: float
    losses: list[float]
    eval: dict[str, float] = field(default_factory=dict)
    model: nn.Module | None = None


def resolve_mixed_precision(choice: str) -> str | None:
    """``auto``: the launcher's setting if any, else bf16 on an accelerator that has it, else fp32.

    Returns None to let ``Accelerator`` read the launcher's setting.
    """
    if choice != "auto":
        return choice
    if os.environ.get("ACCELERATE_MIXED_PRECISION"):
        return None
    # is_bf16_available is True on a bare CPU, where bf16 autocast is slower than fp32: ask only
    # when there is an accelerator (CUDA, XPU, MPS, ...).
    return "bf16" if torch.accelerator.is_available() and is_bf16_available() else "no"


def build_accelerator(config: TrainConfig, accumulation: int = 1) -> Accelerator:
    """An ``Accelerator`` for ``config``; the strategy (DDP, FSDP2, ...) comes from the launcher."""
    kwargs: dict[str, Any] = {"gradient_accumulation_steps": accumulation}
    mixed = resolve_mixed_precision(config.mixed_precision)
    if mixed is not None:
        kwargs["mixed_precision"] = mixed
    if config.report_to != "none":
        kwargs["log_with"] = config.report_to
        kwargs["project_dir"] = str(config.checkpoint_path / "logs")
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and not torch.accelerator.is_available():
        # Under torchrun on a machine without accelerators, accelerate only goes multi-process
        # (gloo) when told it runs on CPU; otherwise every rank silently trains alone.
        kwargs["cpu"] = True
    accelerator = Accelerator(**kwargs)
    if accelerator.num_processes != launched:
        raise RuntimeError(
            f"launched with WORLD_SIZE={launched} but accelerate runs {accelerator.num_processes} process(es); "
            "start multi-process runs with accelerate launch or torchrun"
        )
    return accelerator


def data_parallel_layout(accelerator: Accelerator) -> tuple[int, int]:
    """``(size, rank)`` of the data-parallel group: context/tensor-parallel peers share a batch."""
    pc = accelerator.parallelism_config
    if pc is not None and pc.non_data_parallel_size > 1:
        if pc.data_parallel_size == 1:
            return 1, 0
        return pc.data_parallel_size, accelerator.torch_device_mesh["dp"].get_local_rank()
    return accelerator.num_processes, accelerator.process_index


def load_model_and_tokenizer(config: TrainConfig) -> tuple[PreTrainedModel, Any]:
    """The checkpoint in fp32 (master weights; autocast gives bf16 compute), patched, and its tokenizer."""
    source = resolve_model_source(config.model)  # a .gguf file -> its cached safetensors conversion
    model_config = read_config(source)
    check_weight_files(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer of {config.model!r} has no EOS token, needed to separate documents")
    model = AutoModelForCausalLM.from_pretrained(
        source, config=model_config, dtype=torch.float32, attn_implementation=config.attn_implementation
    )
    patch_model(model, config.method, factor=config.factor, **config.method_kwargs)
    return model, tokenizer


def forward_loss(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 pose: bool = False, accelerator: Accelerator | None = None, loss_chunk_size: int = 0) -> torch.Tensor:
    """Mean next-token cross-entropy of ``input_ids`` ``[batch, seq]`` at ``position_ids``.

    Labels are shifted here rather than inside the model, so that context parallelism can shard
    inputs and labels alike (accelerate's CP guide); the last position has no target.
    ``loss_chunk_size > 0`` computes the same loss without all logits (see loss.py).
    """
    shift_labels = torch.nn.functional.pad(input_ids[:, 1:], (0, 1), value=-100)
    kwargs: dict[str, Any] = {}
    if pose:
        # Skipped positions would otherwise be read as packed-sequence boundaries (see pose.py).
        kwargs["attention_mask"] = torch.ones_like(input_ids)
    buffers = [input_ids, position_ids, shift_labels]
    cp = accelerator is not None and accelerator.parallelism_config is not None and \
        accelerator.parallelism_config.cp_enabled
    if cp:
        with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1],
                                                no_restore_buffers=set(buffers)):
            if loss_chunk_size:
                return causal_lm_loss(model, input_ids, position_ids, shift_labels, loss_chunk_size, **kwargs)
            return model(input_ids=input_ids, position_ids=position_ids, labels=shift_labels,
                         shift_labels=shift_labels, use_cache=False, **kwargs).loss
    if loss_chunk_size:
        return causal_lm_loss(model, input_ids, position_ids, shift_labels, loss_chunk_size, **kwargs)
    return model(input_ids=input_ids, position_ids=position_ids, labels=shift_labels,
                 shift_labels=shift_labels, use_cache=False, **kwargs).loss


@torch.no_grad()
def evaluate(model: nn.Module, blocks: np.ndarray, accelerator: Accelerator, dp_size: int, dp_rank: int,
             micro_batch_size: int = 1) -> dict[str, float]:
    """Mean loss and perplexity of ``blocks`` (full length, contiguous positions), over all processes.

    Every process runs the same number of forwards (sharded models need that); the padding
    repeats a block with weight 0.
    """
    model.eval()
    count = len(blocks)
    per_rank = math.ceil(count / dp_size)
    total = torch.zeros(2, device=accelerator.device, dtype=torch.float64)
    for start in range(0, per_rank, micro_batch_size):
        slots = [dp_rank * per_rank + i for i in range(start, min(start + micro_batch_size, per_rank))]
        weights = [1.0 if slot < count else 0.0 for slot in slots]
        input_ids = take_blocks(blocks, [slot % count for slot in slots]).to(accelerator.device)
        positions = torch.arange(input_ids.shape[1], device=accelerator.device).expand_as(input_ids)
        with accelerator.autocast():
            logits = model(input_ids=input_ids, position_ids=positions, use_cache=False).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none"
        ).mean(dim=1)
        weight = torch.tensor(weights, device=nll.device, dtype=torch.float64)
        total += torch.stack([(nll.double() * weight).sum(), weight.sum()])
    total = accelerator.reduce(total, reduction="sum")
    model.train()
    loss = float(total[0] / total[1])
    return {"loss": loss, "perplexity": math.exp(loss)}


def _check_resume_config(saved: dict[str, Any], config: TrainConfig) -> None:
    current = config.to_dict()
    changed = [key for key in RESUME_INVARIANTS if key in saved and saved[key] != current[key]]
    if changed:
        details = "; ".join(f"{key}: {saved[key]!r} -> {current[key]!r}" for key in changed)
        raise ValueError(f"cannot resume: settings that change the result differ from the saved run ({details})")


class _RunConfig:
    """The run's settings, saved with every training state and checked on resume."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    def state_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_resume_config(state, self.config)


def train(config: TrainConfig, callbacks: Sequence[StepCallback] = ()) -> TrainResult:
    """Fine-tune ``config.model`` with ``config.method`` and write the extended checkpoint.

    Args:
        config: the run's settings (validated on construction).
        callbacks: called on every process after each optimizer step (and checkpoint) with the
            run's progress; e.g. to log elsewhere or to stop a job.

    Returns:
        A :class:`TrainResult`; the checkpoint is in ``config.output_dir``.

    Raises:
        FileNotFoundError: missing dataset files or a missing ``resume`` path.
        ValueError: an unknown method, a sequence the patched model cannot take, LoRA targets
            the model lacks, a global batch the processes do not divide, or a resume whose
            settings differ from the saved run's. All before the first step.
    """
    check_dataset(config.dataset, config.dataset_split)
    resume_from: Path | None = None
    if config.resume and config.resume != "latest":
        resume_from = check_resumable(config.resume)
    elif config.resume == "latest":
        resume_from = latest_checkpoint(config.checkpoint_path)

    accelerator = build_accelerator(config)
    if config.activation_offload and accelerator.device.type == "cpu":
        raise ValueError("activation_offload moves checkpointed activations from an accelerator to host memory; "
                         "training runs on the CPU here, where it only adds copies: set activation_offload=False")
    set_seed(config.seed)
    model, tokenizer = load_model_and_tokenizer(config)
    pc = accelerator.parallelism_config
    cp_size = pc.cp_size if pc is not None else 1
    if cp_size > 1 and config.pose:
        raise ValueError("PoSE needs an attention mask, which context parallelism (causal SDPA only) cannot take")
    dp_size, dp_rank = data_parallel_layout(accelerator)
    plan = plan_run(config, model, dp_size, dp_rank, cp_size)
    if accelerator.is_main_process:
        print_engine_warning(model.config, plan.context, config.method)
    accelerator.gradient_accumulation_steps = plan.accumulation
    if config.lora:
        check_lora_targets(model, config.lora_target_modules)
    save_dtype = save_dtype_for(config, model)

    with accelerator.main_process_first():
        max_blocks = None
        if not is_local_dataset(config.dataset):
            # Stream an HF dataset only as far as the run consumes it.
            max_blocks = config.max_train_steps * config.global_batch_size + config.eval_blocks
        blocks = load_blocks(config.dataset, tokenizer, plan.window, split=config.dataset_split,
                             text_field=config.text_field, max_blocks=max_blocks, cache_dir=config.cache_dir)
    eval_blocks = blocks[len(blocks) - config.eval_blocks:] if config.eval_blocks else None
    train_blocks = blocks[: len(blocks) - config.eval_blocks]
    if config.eval_blocks and len(train_blocks) == 0:
        raise ValueError(f"eval_blocks={config.eval_blocks} leaves no training data out of {len(blocks)} blocks")
    batches = micro_batch_indices(len(train_blocks), config.micro_batch_size, dp_size, dp_rank, config.seed)
    next(batches)  # fails here, before training, when there is less than one micro-batch of data

    if config.activation_checkpointing:
        model.activation_checkpointing_enable(offload=config.activation_offload)
    model.config.use_cache = False
    if config.lora:
        model = apply_lora(model, config.lora_target_modules, config.lora_rank, config.lora_alpha,
                           config.lora_dropout)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                  eps=config.adam_epsilon, weight_decay=config.weight_decay)
    scheduler = build_scheduler(config, optimizer)
    ds_plugin = accelerator.state.deepspeed_plugin
    if ds_plugin is not None:
        # No dataloader goes through prepare(), so DeepSpeed learns the micro-batch here (as
        # accelerate's own error message for a missing micro-batch recommends). Why no
        # prepared DataLoader: its sharding and resume (skip_first_batches) replay the batch order
        # step by step, while micro_batch_indices jumps to any data position in O(1); and
        # DeepSpeed takes the dataloader in the same prepare() as the model, before load_state
        # tells where to resume, so the sampler would need a start set after it was wrapped.
        ds_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = config.micro_batch_size
    # The scheduler is deliberately not prepared: accelerate would step it once per process.
    model, optimizer = accelerator.prepare(model, optimizer)
    # FSDP2 swaps parameters for sharded ones in prepare(): clip the ones that are trained now.
    params = [p for p in model.parameters() if p.requires_grad]
    progress = TrainProgress()
    accelerator.register_for_checkpointing(scheduler, progress, _RunConfig(config))

    if resume_from is not None:
        load_checkpoint(accelerator, resume_from)
        accelerator.print(f"resumed from {resume_from} at step {progress.step}")
    elif config.resume == "latest":
        accelerator.print(f"no training state in {config.checkpoint_path}: starting from step 0")
    # Before the first step (after a resume's own checks), so a refused folder costs no training.
    check_final_output(config)
    if config.report_to != "none":
        accelerator.init_trackers("hf_posext_finetune", config={k: str(v) for k, v in config.to_dict().items()})

    if eval_blocks is not None and progress.step == 0:
        progress.eval["before"] = evaluate(model, eval_blocks, accelerator, dp_size, dp_rank,
                                           config.micro_batch_size)["perplexity"]

    batches = micro_batch_indices(len(train_blocks), config.micro_batch_size, dp_size, dp_rank, config.seed,
                                  start=progress.micro_step)
    tokens_per_step = config.global_batch_size * plan.window
    model.train()
    bar = tqdm(total=config.max_train_steps, initial=progress.step, desc="fine-tuning", unit="step",
               disable=not accelerator.is_local_main_process, dynamic_ncols=True)
    started, first_step = time.perf_counter(), progress.step
    while progress.step < config.max_train_steps:
        step_loss = torch.zeros((), device=accelerator.device)
        for _ in range(plan.accumulation):
            input_ids = take_blocks(train_blocks, next(batches)).to(accelerator.device)
            if config.pose:
                # Seeded by the data position, so a resumed run draws the same positions.
                generator = torch.Generator().manual_seed(config.seed * 1_000_003 + progress.micro_step * 4099 + dp_rank)
                positions = pose_position_ids(plan.window, plan.seq_len, config.pose_chunks,
                                              batch_size=input_ids.shape[0], generator=generator)
                positions = positions.to(accelerator.device)
            else:
                # One row broadcast over the batch, as transformers does without position ids.
                positions = torch.arange(plan.window, device=accelerator.device).unsqueeze(0)
            with accelerator.accumulate(model):
                loss = forward_loss(model, input_ids, positions, pose=config.pose, accelerator=accelerator,
                                    loss_chunk_size=config.loss_chunk_size)
                accelerator.backward(loss)
                if accelerator.sync_gradients and config.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(params, config.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            progress.micro_step += 1
            step_loss += loss.detach().float() / plan.accumulation
        scheduler.step()
        progress.step += 1
        progress.tokens += tokens_per_step
        mean_loss = float(accelerator.reduce(step_loss, reduction="mean"))
        progress.losses.append(mean_loss)
        elapsed = time.perf_counter() - started
        tokens_per_s = (progress.step - first_step) * tokens_per_step / max(elapsed, 1e-9)
        bar.update(1)
        bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if config.report_to != "none":
            accelerator.log({"train/loss": mean_loss, "train/lr": scheduler.get_last_lr()[0],
                             "train/tokens_per_s": tokens_per_s}, step=progress.step)
        if config.checkpointing_steps and progress.step % config.checkpointing_steps == 0:
            save_checkpoint(accelerator, config.checkpoint_path, progress.step, keep=config.checkpoints_total_limit)
        for callback in callbacks:
            callback(progress)
    bar.close()

    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        # AdamW's states (twice the trained weights) are done with: free them before the weights
        # are gathered for saving, when host memory is tightest.
        optimizer.optimizer.state.clear()
    eval_results = dict(progress.eval)
    if eval_blocks is not None:
        eval_results["after"] = evaluate(model, eval_blocks, accelerator, dp_size, dp_rank,
                                         config.micro_batch_size)["perplexity"]
    output_dir = save_final(accelerator, model, tokenizer, config, plan, progress, eval_results, save_dtype)
    if config.report_to != "none":
        accelerator.end_training()
    return TrainResult(
        output_dir=output_dir,
        steps=progress.step,
        tokens=progress.tokens,
        final_loss=progress.losses[-1],
        losses=list(progress.losses),
        eval=eval_results,
        model=accelerator.unwrap_model(model),
    )
