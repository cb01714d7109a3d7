"""The recipe's final checkpoint: gather the weights, merge LoRA, write weights, config, tokenizer,
model card and ``train_results.json`` in one atomic folder that loads in vanilla transformers.

The output folder follows `hf_posext.files.output_folder`'s policy, checked before training
(`check_final_output`) so that a refused folder costs no training time; if the final move
fails, the finished checkpoint stays on disk and the error says where.
"""

from __future__ import annotations

import dataclasses

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import DistributedType
from huggingface_hub import ModelCard
from transformers import PreTrainedModel

from ..data import STDLIB, is_local_dataset
from ..publish import ADAPTER_FOLDER, MODEL_REPO_FILES, model_card
from ..publish.hub_card import base_model_id
from ..publish.tokenizer import raise_model_max_length
from ..files import check_output_dir, output_folder
from ..methods import training_for
from .saved_state import TrainProgress
from .config import TrainConfig
from .lora import merged_state_dict
from .plan import Plan


def save_dtype_for(config: TrainConfig, model: PreTrainedModel) -> torch.dtype:
    """The dtype the weights are saved in; read before training, while ``model`` is the loaded checkpoint."""
    if config.save_dtype != "auto":
        return getattr(torch, config.save_dtype)
    # The checkpoint's own dtype as loaded: a bf16 Hub model is saved in bf16 again.
    dtype = getattr(model.config, "dtype", None) or getattr(model.config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _check_apart(checkpoints: Path, output: Path) -> None:
    """Refuse training states written into the final checkpoint's folder, or around it.

    The final save refuses (or, with ``overwrite``, prunes) a folder holding ``step_*`` folders,
    and a checkpoint folder holding the model is not resumable: either way the run would be lost
    after its last step.
    """
    states, final = Path(os.path.realpath(checkpoints)), Path(os.path.realpath(output))
    where = (
        "is"
        if states == final
        else "is inside"
        if final in states.parents
        else "contains"
        if states in final.parents
        else None
    )
    if where:
        raise ValueError(
            f"--checkpoint-dir (checkpoint_dir) {str(checkpoints)!r} {where} --output-dir (output_dir) "
            f"{str(output)!r}; give the training states a folder of their own (default: "
            f"{str(output)!r} + '-checkpoints')"
        )


def check_final_output(config: TrainConfig) -> Path:
    """Refuse ``config.output_dir`` now, before any training, if the final save would refuse it.

    Also refuses a checkpoint folder holding an earlier run's training states (which this run's
    would replace step by step) unless the run resumes or ``overwrite`` is set.
    """
    sources = [config.model] if os.path.isdir(config.model) else []
    if config.checkpointing_steps:
        _check_apart(config.checkpoint_path, Path(config.output_dir))
        check_output_dir(
            config.checkpoint_path,
            overwrite=config.overwrite,
            sources=sources,
            owns=("step_*", ".step_*"),
            reuse_own=bool(config.resume),
        )
    return check_output_dir(config.output_dir, overwrite=config.overwrite, sources=sources, owns=MODEL_REPO_FILES)


def save_final(
    accelerator: Accelerator,
    model: nn.Module,
    tokenizer: Any,
    config: TrainConfig,
    plan: Plan,
    progress: TrainProgress,
    eval_results: dict[str, float],
    save_dtype: torch.dtype,
    records: dict[str, Any] | None = None,
) -> Path:
    """Gather the weights and write the Hub-ready checkpoint atomically (main process writes).

    ``records``: what reading packed data did (conversations, truncated, skipped...), per dataset,
    written to ``train_results.json``.
    """
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        state_dict = accelerator.get_state_dict(model)  # gathers the shards on the main process
    else:
        # The live tensors: get_state_dict would clone every weight (a second model in memory).
        state_dict = unwrapped.state_dict()
    output_dir = Path(config.output_dir)
    if accelerator.is_main_process:
        base = unwrapped
        adapter_state = None
        if config.lora:
            adapter_state = state_dict
            state_dict = merged_state_dict(state_dict, unwrapped.peft_config["default"])
            base = unwrapped.get_base_model()
        state_dict = {k: v.detach().to("cpu", save_dtype) for k, v in state_dict.items()}
        base.config.use_cache = True
        base.config.dtype = save_dtype
        results = {
            "base_model": config.model,
            "method": config.method,
            "factor": config.factor,
            "original_context": plan.original_context,
            "context": plan.context,
            "seq_len": plan.seq_len,
            "window": plan.window,
            "window_schedule": plan.schedule.describe() if plan.schedule is not None else None,
            # what each step trained (a schedule's window is a function of the step alone: WindowSchedule.window)
            "windows": [plan.schedule.window(step) if plan.schedule else plan.window for step in range(progress.step)],
            "steps": progress.step,
            "tokens": progress.tokens,
            "final_loss": progress.losses[-1] if progress.losses else None,
            "losses": progress.losses,
            "eval": eval_results,
            "records": records or {},
            "config": config.to_dict(),
        }
        sources = [config.model] if os.path.isdir(config.model) else []
        with output_folder(
            output_dir, overwrite=config.overwrite, sources=sources, owns=MODEL_REPO_FILES, keep_on_failure=True
        ) as tmp:
            base.save_pretrained(tmp, state_dict=state_dict)
            if adapter_state is not None:
                # The small file to publish or commit: hf-posext patch BASE OUT --adapter rebuilds the merged model.
                unwrapped.save_pretrained(tmp / ADAPTER_FOLDER, state_dict=adapter_state)
                # PEFT names the local folder the base was loaded from (a cache path): name its Hub id, or none.
                adapter_config = tmp / ADAPTER_FOLDER / "adapter_config.json"
                adapter_config.write_text(
                    json.dumps(
                        {
                            **json.loads(adapter_config.read_text()),
                            "base_model_name_or_path": base_model_id(config.model),
                        },
                        indent=2,
                    )
                )
            tokenizer.save_pretrained(tmp)
            raise_model_max_length(tmp, plan.context)
            (tmp / "train_results.json").write_text(json.dumps(results, indent=2) + "\n")
            card = card_for(base.config, config, plan, progress, eval_results)
            card.save(tmp / "README.md")
            if adapter_state is not None:
                adapter_card(card, config).save(tmp / ADAPTER_FOLDER / "README.md")  # replaces PEFT's empty template
    accelerator.wait_for_everyone()
    return output_dir


def describe_data(config: TrainConfig) -> str:
    """The card's data line: the dataset, or the local files (the first three) and what was left out."""
    if not is_local_dataset(config.dataset):
        return f"{config.dataset[0]} ({config.dataset_split} split)"
    kept = [item for item in config.dataset if not item.startswith("!")]
    excluded = [item[1:] for item in config.dataset if item.startswith("!")]
    names = [
        f"Python standard library sources ({config.dataset_split} split)" if item == STDLIB else Path(item).name
        for item in kept
    ]
    text = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    text = text if kept == [STDLIB] else "local files: " + text
    return text + (f", without {', '.join(f'`{e}`' for e in excluded)}" if excluded else "")


def adapter_card(card: ModelCard, config: TrainConfig) -> ModelCard:
    """The model card of the ``adapter/`` folder: the merged checkpoint's, plus how to rebuild it."""
    adapter = ModelCard(card.content)
    adapter.data.library_name = "peft"
    adapter.data.tags = [*(adapter.data.tags or []), "lora"]
    factor = f" --factor {config.factor:g}" if config.factor is not None else ""
    adapter.text += (
        "\n## This folder\n\n"
        f"The LoRA adapter (PEFT) of the fine-tune above; the merged checkpoint is the base model with the "
        f"`{config.method}` patch and this adapter merged, rebuilt by:\n\n"
        f"```bash\nhf-posext patch BASE OUT --method {config.method}{factor} --adapter {ADAPTER_FOLDER}\n```\n\n"
        "with BASE the model it was trained from (the same weights: a quantized GGUF dequantized, not another "
        "release of the model).\n"
    )
    return adapter


def card_for(
    model_config: Any, config: TrainConfig, plan: Plan, progress: TrainProgress, eval_results: dict[str, float]
):
    """The model card of a fine-tuned checkpoint: the patch plus data, steps, loss and eval."""
    extra: dict[str, Any] = {
        "data": describe_data(config),
        "training sequence length": plan.seq_len,
        "steps": progress.step,
        "training tokens": progress.tokens,
        "final training loss": f"{progress.losses[-1]:.4f}" if progress.losses else "n/a",
        "recipe": (
            f"lr {config.learning_rate:g}, {config.lr_scheduler} schedule, {config.warmup_steps} warm-up steps, "
            f"AdamW betas ({config.adam_beta1}, {config.adam_beta2}), weight decay {config.weight_decay:g}, "
            f"global batch {config.global_batch_size}"
        ),
    }
    if config.lora:
        extra["LoRA"] = (
            f"r={config.lora_rank}, alpha={config.lora_alpha}, targets {', '.join(config.lora_target_modules)} (merged)"
        )
    if config.pose:
        extra["PoSE"] = f"{plan.window}-token windows, {config.pose_chunks} chunks, positions up to {plan.seq_len}"
    if plan.schedule is not None:
        extra["window schedule"] = plan.schedule.describe()
    if config.short_fraction:
        source = (
            describe_data(dataclasses.replace(config, dataset=config.short_dataset))
            if config.short_dataset
            else "the same data"
        )
        extra["short documents"] = (
            f"{config.short_fraction:.0%} of the micro-batches: whole documents of up to {config.short_seq_len} tokens "
            f"at their own positions, from {source}"
        )
    extra.update(training_for(config.method).describe(config.training_options))
    for phase in ("before", "after"):
        if phase in eval_results:
            extra[f"held-out perplexity at {plan.window} tokens, {phase} training"] = f"{eval_results[phase]:.3f}"
    card = model_card(model_config, base_model=config.model, extra=extra)  # names Hub ids only, never a path
    if not is_local_dataset(config.dataset):
        card.data.datasets = list(config.dataset)
    return card
