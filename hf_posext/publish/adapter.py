"""Adapter merges: `merge_adapter` rebuilds a LoRA fine-tune from its base and its PEFT adapter.

`read_adapter` and `check_adapter` refuse an adapter that does not fit its base, before
anything is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..files import output_folder
from ..patching import patch_info, patch_model
from ..validation.saved_model import check_weight_files, read_config
from .card import model_card
from .repository import ADAPTER_FOLDER, MODEL_REPO_FILES
from .tokenizer import raise_model_max_length


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_PEFT_PREFIX = "base_model.model."
_LORA_TENSOR = re.compile(r"(.+)\.lora_([AB])\.weight")


def read_adapter(adapter_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config and tensors of the PEFT adapter in ``adapter_dir``, read before any model loads.

    Raises:
        FileNotFoundError: no ``adapter_config.json``, or no weights file beside it (PEFT would
            look for a Hub repository named like the folder instead).
        ValueError: a damaged ``adapter_config.json`` or weights file, naming it.
    """
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"no PEFT adapter at {adapter_dir} (it has no adapter_config.json)")
    weights = next((adapter_dir / name for name in ADAPTER_WEIGHTS if (adapter_dir / name).is_file()), None)
    if weights is None:
        raise FileNotFoundError(
            f"the PEFT adapter at {adapter_dir} has no weights: {' or '.join(ADAPTER_WEIGHTS)} is missing"
        )
    config_file = adapter_dir / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not valid JSON ({error}): a damaged adapter") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} holds {type(config).__name__}, not a JSON object: a damaged adapter")
    try:
        if weights.suffix == ".safetensors":
            return config, load_file(weights)
        return config, torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as error:  # safetensors' and torch's own errors on a damaged or truncated file
        raise ValueError(f"{weights} cannot be read ({type(error).__name__}: {error}): a damaged adapter") from None


def check_adapter(
    model: nn.Module, adapter_config: dict[str, Any], tensors: dict[str, torch.Tensor], where: Path
) -> None:
    """Raise unless the adapter (``tensors``, saved by PEFT) fits ``model``, the base it is merged into.

    Every tensor must belong to a module of the base: a LoRA pair's ``A`` takes the layer's input
    width, ``B`` gives its output width, a trained copy (``modules_to_save``) has the base
    parameter's shape. And every linear layer the adapter's ``target_modules`` names must have its
    pair, or a base with more layers would take the adapter's layers and leave the rest untrained.

    Raises:
        ValueError: naming the first tensor or layer that does not fit, with both shapes.
    """
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    adapted = set()
    other_base = f"(was {where} trained on this base?)"
    for key, tensor in tensors.items():
        name = key.removeprefix(_PEFT_PREFIX)
        shape = tuple(tensor.shape)
        lora = _LORA_TENSOR.fullmatch(name)
        owner = lora.group(1) if lora else name.split(".lora_")[0].rpartition(".")[0]
        if owner not in modules:
            raise ValueError(f"adapter tensor {key} belongs to {owner}, which the base model lacks {other_base}")
        if lora:
            layer = modules[owner]
            if not isinstance(layer, nn.Linear):
                raise ValueError(f"adapter tensor {key} adapts {owner}, no linear layer of the base {other_base}")
            adapted.add(owner)
            rank = (shape or (0,))[0 if lora.group(2) == "A" else -1]
            declared = adapter_config.get("r")
            if not adapter_config.get("rank_pattern") and declared is not None and rank != declared:
                raise ValueError(
                    f"adapter tensor {key} has rank {rank} but {where}/adapter_config.json says r={declared!r}: "
                    "the config does not match the weights (a damaged or mixed-up adapter)"
                )
            want = (rank, layer.in_features) if lora.group(2) == "A" else (layer.out_features, rank)
            base = f"the base's {owner} ({layer.in_features} -> {layer.out_features} features) takes"
        elif name in params:
            want, base = tuple(params[name].shape), f"the base's {name} is"
        else:
            continue  # another PEFT tensor kind (DoRA's magnitudes...): PEFT itself checks it
        if shape != want:
            raise ValueError(f"adapter tensor {key} has shape {shape}; {base} {want} {other_base}")
    targets = adapter_config.get("target_modules")
    if (
        isinstance(targets, list)
        and not adapter_config.get("layers_to_transform")
        and not adapter_config.get("exclude_modules")
    ):
        for path, module in modules.items():
            if isinstance(module, nn.Linear) and path.rpartition(".")[2] in targets and path not in adapted:
                raise ValueError(
                    f"the base's {path} is a target of the adapter ({', '.join(sorted(targets))}) but {where} "
                    f"has no LoRA tensors for it: it was trained on a model with other layers"
                )


def merge_adapter(
    source: str | os.PathLike,
    output_dir: str | os.PathLike,
    adapter: str | os.PathLike,
    method: str,
    factor: float | None,
    *,
    overwrite: bool = False,
    **kwargs: Any,
) -> Path:
    """Write ``source`` patched with ``method`` and with a PEFT ``adapter`` merged into its weights.

    The rebuild of a LoRA fine-tune from its base model and its small adapter (the recipe writes
    one in ``<output_dir>/adapter``): the adapter was trained on the patched model, so the base is
    patched the same way first. Weights are merged in fp32 and saved in the base's dtype.

    Raises:
        FileNotFoundError: no checkpoint at ``source`` or no PEFT adapter (or its weights) at ``adapter``.
        ValueError: an adapter trained on another base (another width or layer count): the first
            tensor or layer that does not fit (`check_adapter`). All before anything is written.
    """
    adapter_dir = Path(adapter)
    adapter_config, tensors = read_adapter(adapter_dir)
    source_dir = Path(source)
    if not (source_dir / "config.json").is_file():
        raise FileNotFoundError(f"{source_dir} has no config.json: not a transformers checkpoint")
    config = read_config(source_dir)
    check_weight_files(source_dir)
    saved_dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(saved_dtype, str):
        saved_dtype = getattr(torch, saved_dtype)
    model = AutoModelForCausalLM.from_pretrained(source_dir, config=config, dtype=torch.float32)
    patch_model(model, method, factor=factor, **kwargs)
    check_adapter(model, adapter_config, tensors, adapter_dir)
    del tensors  # PEFT reads the file again itself
    from peft import PeftModel  # here: hf-posext eval and hf-posext patch without --adapter never need peft

    try:
        merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    except (RuntimeError, ValueError, KeyError, TypeError) as error:  # what check_adapter cannot foresee
        text = " ".join(str(error).split())
        raise ValueError(f"the PEFT adapter at {adapter_dir} cannot be applied to the base: {text[:500]}") from error
    tokenizer = AutoTokenizer.from_pretrained(source_dir)
    owns = (*MODEL_REPO_FILES, ADAPTER_FOLDER)
    with output_folder(output_dir, overwrite=overwrite, sources=[source_dir, adapter_dir], owns=owns) as tmp:
        state_dict = {k: v.to(saved_dtype) for k, v in merged.state_dict().items()}
        merged.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        shutil.copytree(adapter_dir, tmp / ADAPTER_FOLDER, ignore=shutil.ignore_patterns(".*"))
        raise_model_max_length(tmp, patch_info(merged.config)["context_length"])
        model_card(merged.config, base_model=str(source), extra={"adapter": f"{adapter_dir} (merged)"}).save(
            tmp / "README.md"
        )
    return Path(output_dir)


__all__ = ["ADAPTER_WEIGHTS", "check_adapter", "merge_adapter", "read_adapter"]
