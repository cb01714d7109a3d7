"""LoRA for context extension, the LongLoRA way (Chen et al. 2023, arXiv 2309.12307, section 3.3).

LoRA on ``q/k/v/o_proj`` plus trainable embeddings and norms (PEFT ``modules_to_save``), merged
into a plain state dict on save (docs/notes/training.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from peft import LoraConfig, PeftModel, get_peft_model


def _is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return isinstance(module, nn.LayerNorm) or name.endswith(("RMSNorm", "LayerNorm"))


def trainable_extras(model: nn.Module) -> list[str]:
    """Short names (last path component) of the input embedding and every norm module.

    PEFT matches ``modules_to_save`` entries against the end of module paths, so one short name
    (``input_layernorm``) selects that norm in every layer.
    """
    embedding = model.get_input_embeddings()
    names = set()
    for qualified, module in model.named_modules():
        if module is embedding or _is_norm(module):
            names.add(qualified.rsplit(".", 1)[-1])
    return sorted(names)


def check_lora_targets(model: nn.Module, target_modules: Sequence[str]) -> None:
    """Raise before training if a LoRA target names no linear layer of ``model``.

    Raises:
        ValueError: naming the missing targets and the linear layers the model has.
    """
    linear_names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    missing = [target for target in target_modules if target not in linear_names]
    if missing:
        raise ValueError(
            f"LoRA target modules {missing} are not linear layers of {type(model).__name__}; "
            f"its linear layers are: {', '.join(sorted(linear_names))} (set --lora-target-modules)"
        )


def apply_lora(
    model: nn.Module,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    rank: int = 8,
    alpha: int = 16,
    dropout: float = 0.0,
    train_embeddings_and_norms: bool = True,
) -> PeftModel:
    """Wrap ``model`` in LoRA adapters, with embeddings and norms trainable (LongLoRA).

    Args:
        model: a transformers causal LM (patched already).
        target_modules: short names of the linear layers to adapt.
        rank, alpha, dropout: LoRA's ``r``, ``lora_alpha`` and ``lora_dropout``.
        train_embeddings_and_norms: also train the input embedding and every norm.

    Returns:
        The PEFT model; only adapters (and the extras) require grad.

    Raises:
        ValueError: a target module the model does not have.
    """
    check_lora_targets(model, target_modules)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    extras = trainable_extras(model) if train_embeddings_and_norms else []
    if tied and extras:
        # A trainable copy of a tied embedding would untie it from the output head, and the merged
        # checkpoint would silently differ from what was trained; keep the embedding frozen then.
        embedding_name = next(n for n, m in model.named_modules() if m is model.get_input_embeddings())
        extras = [name for name in extras if name != embedding_name.rsplit(".", 1)[-1]]
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        modules_to_save=extras or None,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # PEFT (0.21, peft_model.py) reads transformers' deprecated ``is_gradient_checkpointing``,
        # and transformers 5 warns about it in every LoRA run's log: neither ours nor the user's.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated", category=FutureWarning)
        return get_peft_model(model, config)


def merged_state_dict(
    state_dict: dict[str, torch.Tensor], peft_config: Any, adapter: str = "default"
) -> dict[str, torch.Tensor]:
    """A PEFT LoRA model's full state dict folded into the base model's keys and weights.

    ``W' = W + (B @ A) * alpha / r`` for every adapted linear layer and the trained copy of every
    ``modules_to_save`` module. This works on a gathered state dict, which is all FSDP and ZeRO-3
    hand the main process; ``tests/train/test_loop.py`` checks it against PEFT's own
    ``merge_and_unload``.
    """
    if getattr(peft_config, "use_dora", False) or getattr(peft_config, "use_rslora", False):
        raise ValueError("merging DoRA / rsLoRA adapters from a state dict is not supported")
    scaling = peft_config.lora_alpha / peft_config.r
    prefix = "base_model.model."
    out: dict[str, torch.Tensor] = {}
    lora_a, lora_b = {}, {}
    for key, value in state_dict.items():
        name = key[len(prefix) :] if key.startswith(prefix) else key
        if ".original_module." in name:
            continue
        if f".lora_A.{adapter}." in name:
            lora_a[name.replace(f".lora_A.{adapter}.weight", "")] = value
            continue
        if f".lora_B.{adapter}." in name:
            lora_b[name.replace(f".lora_B.{adapter}.weight", "")] = value
            continue
        name = name.replace(f".modules_to_save.{adapter}.", ".").replace(".base_layer.", ".")
        out[name] = value
    for layer, a in lora_a.items():
        weight = out[f"{layer}.weight"]
        delta = (lora_b[layer].float() @ a.float()) * scaling
        out[f"{layer}.weight"] = (weight.float() + delta).to(weight.dtype)
    return out
