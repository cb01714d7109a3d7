"""The fine-tune recipe: patch -> data -> train -> save, through accelerate on one or many devices.

`FinetuneRecipe` runs the YaRN recipe (arXiv 2309.00071, section 4) for any registered
method in four parts (setup, train step, save, cleanup: torchtune's recipe interface);
`train` runs them. The strategy comes from the ``accelerate launch`` config. What it
guarantees and how to call it: docs/notes/training.md.

Longer than ~400 lines on purpose: the recipe is one class read top to bottom (torchtune's recipes are
one file each), and `FinetuneRecipe.setup`'s steps share its attributes and must run in order.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from accelerate.utils import DistributedType, set_seed
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..data import check_dataset, is_local_dataset
from ..publish.tokenizer import check_tokenizer_config
from ..gguf import resolve_model_source
from ..methods import training_for
from ..patching import patch_model
from ..readers import print_engine_warning
from ..validation.saved_model import check_weight_files, read_config
from .blocks import load_blocks, load_document_blocks, micro_batch_indices
from .saved_state import (
    TrainProgress,
    check_resumable,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    saved_custom_state,
)
from .config import TrainConfig, build_scheduler
from .conversations import RecordCounts, check_chat_template, holds_conversations
from .distributed import build_accelerator, data_parallel_layout, describe_strategy
from .final_model import check_final_output, save_dtype_for, save_final
from .lora import apply_lora, check_lora_targets
from .micro_batches import MicroBatch, MicroBatches
from .plan import plan_run
from .resume import RUN_CONFIG_STATE, RunConfig, check_resume_config, check_resume_layout, process_layout
from .sequence_parallel import check_sequence_parallel, sequence_parallel_group, setup_sequence_parallel
from .steps import check_finite_loss, evaluate, forward_loss

StepCallback = Callable[[TrainProgress], None]
EMPTY = RecordCounts().as_dict()


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
    patch_model(model, config.method, factor=config.factor, **config.method_arguments)
    return model, tokenizer


class FinetuneRecipe:
    """One fine-tune run in parts: `setup`, `train_step` (or `train`), `save`, `cleanup`.

    Args:
        config: the run's settings (validated on construction).
        callbacks: called on every process after each optimizer step (and checkpoint) with the
            run's progress; e.g. to log elsewhere or to stop a job.

    After `setup`, ``model``, ``optimizer``, ``scheduler``, ``accelerator``, ``plan`` and
    ``progress`` are the run's; `train` is ``setup(); train(); save()`` with ``cleanup()`` always.
    """

    def __init__(self, config: TrainConfig, callbacks: Sequence[StepCallback] = ()) -> None:
        self.config = config
        self.callbacks = list(callbacks)
        self.accelerator: Any = None
        self.bar: Any = None
        self.trackers = False

    def setup(self) -> None:
        """Load, patch, read the data, build the optimizer, resume: everything that can fail, before the first step.

        The steps run in this order, which seeded and resumed runs depend on (the seed is set
        just before the model loads; LoRA's weights draw from it after the data is read).

        Raises:
            FileNotFoundError: missing dataset files or a missing ``resume`` path.
            ValueError: an unknown method, a sequence the patched model cannot take, LoRA targets
                the model lacks, a global batch the processes do not divide, or a resume whose
                settings differ from the saved run's.
        """
        self._check_sources()
        resume_from, saved = self._find_resume()
        layout = self._setup_accelerator(resume_from, saved)
        model = self._setup_model()
        self._setup_method(model)
        self._setup_data()
        model = self._setup_trained_model(model)
        optimizer = self._setup_optimizer(model)
        self._prepare(model, optimizer, layout)
        self._resume(resume_from)

    def _check_sources(self) -> None:
        """Check the datasets and the tokenizer files; sets ``config.packing`` for conversations."""
        config = self.config
        check_dataset(config.dataset, config.dataset_split)
        if config.short_dataset:
            check_dataset(config.short_dataset, config.dataset_split)
        if not config.packing and holds_conversations(config.dataset, config.dataset_split, config.text_field):
            if config.pose:
                raise ValueError(
                    f"dataset {config.dataset!r} holds conversations, which are trained packed (each at its own "
                    "positions); PoSE spreads one window's positions: set pose=False, or give conversations as the "
                    "short side of the mix (short_dataset)"
                )
            config.packing = True  # the run record says so; a resume detects the same
        if Path(config.model).is_dir():  # the tokenizer reads it first, the final save rewrites it
            check_tokenizer_config(config.model)

    def _find_resume(self) -> tuple[Path | None, dict[str, Any] | None]:
        """The training state to resume from and its saved settings (checked against ours), or Nones.

        Runs before a model loads (see `RunConfig`), so a refused resume costs no loading.
        """
        config = self.config
        resume_from: Path | None = None
        if config.resume and config.resume != "latest":
            resume_from = check_resumable(config.resume)
        elif config.resume == "latest":
            resume_from = latest_checkpoint(config.checkpoint_path)
        saved = saved_custom_state(resume_from, RUN_CONFIG_STATE) if resume_from is not None else None
        if saved is not None:
            check_resume_config(saved, config)
        return resume_from, saved

    def _setup_accelerator(self, resume_from: Path | None, saved: dict[str, Any] | None) -> dict[str, Any]:
        """Set ``accelerator``, ``dp_size`` and ``dp_rank``; return the process layout a state is tied to.

        Refuses a resume on other processes than the saved state's, and activation offload on a CPU.
        """
        config = self.config
        self.accelerator = accelerator = build_accelerator(config)
        self.dp_size, self.dp_rank = data_parallel_layout(accelerator)
        layout = process_layout(accelerator.num_processes, self.dp_size, accelerator.distributed_type.value)
        if saved is not None:
            check_resume_layout(saved, resume_from, layout)
        if config.activation_offload and accelerator.device.type == "cpu":
            raise ValueError(
                "activation_offload moves checkpointed activations from an accelerator to host memory; "
                "training runs on the CPU here, where it only adds copies: set activation_offload=False"
            )
        return layout

    def _setup_model(self) -> PreTrainedModel:
        """Seed, then load and patch the model; sets ``tokenizer`` and checks its chat template if needed."""
        config = self.config
        set_seed(config.seed)
        model, self.tokenizer = load_model_and_tokenizer(config)
        chat_data = [config.dataset] + ([config.short_dataset or config.dataset] if config.short_fraction else [])
        if config.chat_template is not None or any(
            holds_conversations(data, config.dataset_split, config.text_field) for data in chat_data
        ):
            check_chat_template(self.tokenizer, config.model, config.chat_template)
        return model

    def _setup_method(self, model: PreTrainedModel) -> None:
        """Plan the run against the patched ``model``: sets ``plan``, ``sequence_parallel`` and ``save_dtype``.

        Also warns of engines that cannot read the method and sets the accelerator's accumulation.
        """
        config, accelerator = self.config, self.accelerator
        pc = accelerator.parallelism_config
        cp_size = pc.cp_size if pc is not None else 1
        if cp_size > 1 and config.pose:
            raise ValueError("PoSE needs an attention mask, which context parallelism (causal SDPA only) cannot take")
        self.plan = plan = plan_run(config, model, self.dp_size, self.dp_rank, cp_size)
        if accelerator.is_main_process:
            print_engine_warning(model.config, plan.context, config.method)
        accelerator.gradient_accumulation_steps = plan.accumulation
        self.sequence_parallel: tuple[int, int] | None = None
        if pc is not None and pc.sp_enabled:
            check_sequence_parallel(config, model, pc.sp_size, plan.window)
            self.sequence_parallel = setup_sequence_parallel(accelerator, model, plan.window)
        if config.lora:
            check_lora_targets(model, config.lora_target_modules)
        self.save_dtype = save_dtype_for(config, model)

    def _setup_trained_model(self, model: PreTrainedModel) -> nn.Module:
        """``model`` as it trains: activation checkpointing, no KV cache, and LoRA adapters if asked.

        After the data is read: LoRA's initial weights draw from the seeded RNG.
        """
        config = self.config
        if config.activation_checkpointing:
            model.activation_checkpointing_enable(offload=config.activation_offload)
        model.config.use_cache = False
        if config.lora:
            return apply_lora(
                model, config.lora_target_modules, config.lora_rank, config.lora_alpha, config.lora_dropout
            )
        return model

    def _setup_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """AdamW over ``model``'s trained parameters; sets ``scheduler`` (never prepared: see `_prepare`)."""
        config = self.config
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params,
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )
        self.scheduler = build_scheduler(config, optimizer)
        return optimizer

    def _prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, layout: dict[str, Any]) -> None:
        """Wrap ``model`` and ``optimizer`` for the strategy: sets ``model``, ``optimizer`` and ``params``.

        Also sets ``progress`` and registers it, the scheduler and the settings for checkpointing.
        """
        config, accelerator = self.config, self.accelerator
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
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        accelerator.print(describe_strategy(accelerator, self.model, self.dp_size))
        # FSDP2 swaps parameters for sharded ones in prepare(): clip the ones that are trained now.
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.progress = TrainProgress()
        # In this order in every state saved so far: the settings are third (RUN_CONFIG_STATE).
        accelerator.register_for_checkpointing(self.scheduler, self.progress, RunConfig(config, layout))

    def _resume(self, resume_from: Path | None) -> None:
        """Load the training state, then what the first step needs: sets ``batches``; starts the trackers.

        Also checks the final output folder and evaluates before training (``eval_blocks``, step 0).
        """
        config, accelerator, progress = self.config, self.accelerator, self.progress
        if resume_from is not None:
            load_checkpoint(accelerator, resume_from)
            accelerator.print(f"resumed from {resume_from} at step {progress.step}")
        elif config.resume == "latest":
            accelerator.print(f"no training state in {config.checkpoint_path}: starting from step 0")
        # Before the first step (after a resume's own checks), so a refused folder costs no training.
        check_final_output(config)
        if config.report_to != "none":
            accelerator.init_trackers("hf_posext_finetune", config={k: str(v) for k, v in config.to_dict().items()})
            self.trackers = True
        if self.eval_blocks is not None and progress.step == 0:
            progress.eval["before"] = self.evaluate()
        self.batches = MicroBatches(
            config, self.plan, self.train_blocks, self.short_blocks, accelerator.device, progress.micro_step
        )
        self._started, self._first_tokens = time.perf_counter(), progress.tokens

    def _setup_data(self) -> None:
        """Tokenized blocks, split into training and held-out ones; fails if there is not one micro-batch."""
        config, accelerator = self.config, self.accelerator
        self.record_counts = {"dataset": RecordCounts(), "short_dataset": RecordCounts()}
        # How every dataset of the run is read, and how its documents are packed (packing, the short side).
        source = {"split": config.dataset_split, "text_field": config.text_field, "cache_dir": config.cache_dir}
        packed = {"loss_on": config.loss_on, "skip_bad_records": config.skip_bad_records}
        with accelerator.main_process_first():
            max_blocks = None
            if not is_local_dataset(config.dataset):
                # Stream an HF dataset only as far as the run consumes it.
                max_blocks = config.max_train_steps * config.global_batch_size + config.eval_blocks
            if config.packing:
                blocks = load_document_blocks(
                    config.dataset,
                    self.tokenizer,
                    self.plan.window,
                    max_blocks=max_blocks,
                    counts=self.record_counts["dataset"],
                    **source,
                    **packed,
                )
            else:
                blocks = load_blocks(config.dataset, self.tokenizer, self.plan.window, max_blocks=max_blocks, **source)
        self.eval_blocks = blocks[len(blocks) - config.eval_blocks :] if config.eval_blocks else None
        self.train_blocks = blocks[: len(blocks) - config.eval_blocks]
        if config.eval_blocks and len(self.train_blocks) == 0:
            raise ValueError(f"eval_blocks={config.eval_blocks} leaves no training data out of {len(blocks)} blocks")
        batches = micro_batch_indices(
            len(self.train_blocks), config.micro_batch_size, self.dp_size, self.dp_rank, config.seed
        )
        next(batches)  # fails here, before training, when there is less than one micro-batch of data
        self.short_blocks = None
        if config.short_fraction > 0:
            with accelerator.main_process_first():
                short_data = config.short_dataset or config.dataset
                self.short_blocks = load_document_blocks(
                    short_data,
                    self.tokenizer,
                    self.plan.short_len,
                    max_blocks=None
                    if is_local_dataset(short_data)
                    else config.max_train_steps * config.global_batch_size,
                    counts=self.record_counts["short_dataset"],
                    **source,
                    **packed,
                )
            short = micro_batch_indices(
                len(self.short_blocks), config.micro_batch_size, self.dp_size, self.dp_rank, config.seed
            )
            next(short)

    def evaluate(self) -> float:
        """Perplexity of the held-out blocks (``eval_blocks``), over all processes."""
        return evaluate(
            self.model, self.eval_blocks, self.accelerator, self.dp_size, self.dp_rank, self.config.micro_batch_size
        )["perplexity"]

    def _pinned(self, batch: MicroBatch) -> contextlib.AbstractContextManager:
        """``batch``'s forward and backward pinned as its method asks (LongRoPE: its factor set); else nothing."""
        if batch.pin is None:
            return contextlib.nullcontext()
        return training_for(self.config.method).pinned(self.model, batch.pin)

    def train_step(self) -> float:
        """One optimizer step (``plan.accumulation`` micro-batches): its mean loss over all processes.

        Also steps the schedule, logs, saves a training state every ``checkpointing_steps`` and
        runs the callbacks.
        """
        config, accelerator, progress = self.config, self.accelerator, self.progress
        step_loss = torch.zeros((), device=accelerator.device)
        for _ in range(self.plan.accumulation):
            batch = self.batches.next(progress.step, progress.micro_step)
            with accelerator.accumulate(self.model), self._pinned(batch):
                loss = forward_loss(
                    self.model,
                    batch.input_ids,
                    batch.positions,
                    pose=config.pose and not batch.short,
                    accelerator=accelerator,
                    loss_chunk_size=config.loss_chunk_size,
                    shift_labels=batch.labels,
                    sequence_parallel=(*self.sequence_parallel, sequence_parallel_group())
                    if self.sequence_parallel is not None
                    else None,
                )
                check_finite_loss(loss, progress.step + 1, accelerator)
                accelerator.backward(loss)
                if accelerator.sync_gradients and config.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(self.params, config.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            progress.micro_step += 1
            progress.tokens += batch.input_ids.numel() * self.dp_size
            step_loss += loss.detach().float() / self.plan.accumulation
        self.scheduler.step()
        progress.step += 1
        mean_loss = float(accelerator.reduce(step_loss, reduction="mean"))
        progress.losses.append(mean_loss)
        elapsed = time.perf_counter() - self._started
        tokens_per_s = (progress.tokens - self._first_tokens) / max(elapsed, 1e-9)
        lr = self.scheduler.get_last_lr()[0]
        if self.bar is not None:
            # The postfix first: the bar's last render shows this step's loss, not the one before.
            self.bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", lr=f"{lr:.2e}", refresh=False)
            self.bar.update(1)
        if config.report_to != "none":
            accelerator.log(
                {"train/loss": mean_loss, "train/lr": lr, "train/tokens_per_s": tokens_per_s}, step=progress.step
            )
        if config.checkpointing_steps and progress.step % config.checkpointing_steps == 0:
            save_checkpoint(accelerator, config.checkpoint_path, progress.step, keep=config.checkpoints_total_limit)
        for callback in self.callbacks:
            callback(progress)
        return mean_loss

    def train(self) -> None:
        """`train_step` until ``max_train_steps`` (from where a resumed run stopped), with a progress bar."""
        self.model.train()
        self.bar = tqdm(
            total=self.config.max_train_steps,
            initial=self.progress.step,
            desc="fine-tuning",
            unit="step",
            disable=not self.accelerator.is_local_main_process,
            dynamic_ncols=True,
        )
        self._started, self._first_tokens = time.perf_counter(), self.progress.tokens
        while self.progress.step < self.config.max_train_steps:
            self.train_step()
        self.bar.close()
        self.bar = None

    def save(self) -> TrainResult:
        """Evaluate after training (``eval_blocks``) and write the final checkpoint to ``config.output_dir``."""
        accelerator, progress = self.accelerator, self.progress
        if accelerator.distributed_type != DistributedType.DEEPSPEED:
            # AdamW's states (twice the trained weights) are done with: free them before the weights
            # are gathered for saving, when host memory is tightest.
            self.optimizer.optimizer.state.clear()
        eval_results = dict(progress.eval)
        if self.eval_blocks is not None:
            eval_results["after"] = self.evaluate()
        records = {name: counts.as_dict() for name, counts in self.record_counts.items() if counts.as_dict() != EMPTY}
        output_dir = save_final(
            accelerator,
            self.model,
            self.tokenizer,
            self.config,
            self.plan,
            progress,
            eval_results,
            self.save_dtype,
            records,
        )
        return TrainResult(
            output_dir=output_dir,
            steps=progress.step,
            tokens=progress.tokens,
            final_loss=progress.losses[-1],
            losses=list(progress.losses),
            eval=eval_results,
            model=accelerator.unwrap_model(self.model),
        )

    def cleanup(self) -> None:
        """Close the progress bar and the trackers; runs after a failure too."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.trackers:
            self.accelerator.end_training()
            self.trackers = False


def train(config: TrainConfig, callbacks: Sequence[StepCallback] = ()) -> TrainResult:
    """Fine-tune ``config.model`` with ``config.method`` and write the extended checkpoint (`FinetuneRecipe`).

    Args:
        config: the run's settings (validated on construction).
        callbacks: called on every process after each optimizer step (and checkpoint) with the
            run's progress; e.g. to log elsewhere or to stop a job.

    Returns:
        A `TrainResult`; the checkpoint is in ``config.output_dir``.

    Raises:
        FileNotFoundError: missing dataset files or a missing ``resume`` path.
        ValueError: an unknown method, a sequence the patched model cannot take, LoRA targets
            the model lacks, a global batch the processes do not divide, or a resume whose
            settings differ from the saved run's. All before the first step.
    """
    recipe = FinetuneRecipe(config, callbacks)
    try:
        recipe.setup()
        recipe.train()
        return recipe.save()
    finally:
        recipe.cleanup()
