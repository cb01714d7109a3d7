"""Checkpoints for others to load: model cards, config-only context extension, adapter merges.

:func:`extend_checkpoint` loads no weights: it copies a checkpoint's files byte for byte and
rewrites only ``config.json`` and ``README.md``, so extending a 70B model takes seconds.
:func:`merge_adapter` rebuilds a LoRA fine-tune from its base and its adapter. Beside it: what
travels with an extended checkpoint, its card's origin and readers table (:mod:`.hub_card`) and its
tokenizer's raised ``model_max_length`` (:mod:`.tokenizer`; the fine-tune recipe writes both too).
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
from huggingface_hub import ModelCard, ModelCardData, snapshot_download
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..files import output_folder
from ..methods import method_class
from ..patching import patch_info, patch_model
from ..readers import support
from ..validation.checkpoint import check_weight_files, read_config
from .hub_card import base_model_id, readers_section
from .tokenizer import raise_model_max_length


def model_card(config: Any, base_model: str | None = None, extra: dict[str, Any] | None = None) -> ModelCard:
    """A Hub model card (README.md with YAML metadata) describing the patch ``config`` carries.

    Args:
        config: a patched transformers config.
        base_model: the Hub id or path of the checkpoint that was extended; the card names only
            its Hub id (:func:`~hf_posext.export.hub_card.base_model_id`), never a local path.
        extra: more ``key: value`` lines for the card's table (data, steps, final loss, eval...).
    """
    info = patch_info(config)
    base_model = base_model_id(base_model)
    method = info["method"] or "none"
    scales_rope = info["method"] is None or method_class(method).scales_rope
    original = info.get("original_max_position_embeddings")
    context = info.get("context_length")
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        base_model=base_model,
        tags=["hf-posext", "long-context", method],
    )
    skip = {
        "method",
        "rope_parameters",
        "composed_on",
        "context_length",
        "max_position_embeddings",
        "original_max_position_embeddings",
    }
    if not scales_rope:
        skip.add("factor")
    arguments = {k: v for k, v in info.items() if k not in skip and v is not None}
    context_rows = {"original context": original, "extended context": context} if scales_rope else {}
    rows = {
        "method": method,
        **context_rows,
        **arguments,
        "rope_parameters": f"`{info['rope_parameters']}`",
        **(extra or {}),
    }
    table = "\n".join(f"| {key} | {value} |" for key, value in rows.items())
    what = (
        f"with its context extended from {original} to {context} tokens"
        if scales_rope
        else f"with its position encoding replaced by `{method}`"
    )
    if info.get("composed_on"):
        what += (
            f", composed on its own `{info['composed_on']}` rope scaling ({original} tokens is what that scaling "
            f"already reached; `{method}` extends it; saved as rope_type `{info['rope_parameters']['rope_type']}`)"
        )
    body = (
        f"# {card_title(config, base_model)}\n\n"
        f"This checkpoint is {base_model or 'a local model'} {what} by "
        "[hf-posext](https://pypi.org/project/hf-posext/) "
        f"(`{method}`).\n\n"
        f"| | |\n|---|---|\n{table}\n\n" + readers_section(support(config, context or config.max_position_embeddings))
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def card_title(config: Any, base_model: str | None = None) -> str:
    """A model card's title: ``"tiny-base with a 512-token context (yarn, factor 8)"``.

    The base model is named by its Hub id only; a local one by its architecture (``"A llama model"``).
    """
    info = patch_info(config)
    method = info["method"] or "none"
    subject = base_model or f"A {getattr(config, 'model_type', None) or 'transformers'} model"
    if info["method"] is None or method_class(method).scales_rope:
        factor = f", factor {info['factor']:g}" if isinstance(info.get("factor"), (int, float)) else ""
        return f"{subject} with a {info.get('context_length')}-token context ({method}{factor})"
    return f"{subject} with {method} positions"


CONFIG_ONLY_FILES = ("config.json", "README.md")

#: What a model repository needs, as name patterns: weights, config, generation config, tokenizer
#: files, custom code of ``trust_remote_code`` models, the model card and the recipe's results.
#: ``hf-posext push`` uploads these (unless told otherwise) and the checkpoint writers own them
#: (with ``--overwrite`` they replace these files of an existing folder and keep the others).
#: Where a LoRA fine-tune keeps its adapter inside the merged checkpoint (PEFT's files).
ADAPTER_FOLDER = "adapter"
MODEL_REPO_FILES = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "configuration_*.py",
    "modeling_*.py",
    "tokenization_*.py",
    "README.md",
    "train_results.json",
    ADAPTER_FOLDER,
)


def extend_checkpoint(
    source: str | os.PathLike,
    output_dir: str | os.PathLike,
    method: str,
    factor: float,
    *,
    overwrite: bool = False,
    extra_files: dict[str, str] | None = None,
    **kwargs: Any,
) -> Path:
    """Write ``source`` with its config extended by ``method`` to ``output_dir``; weights untouched.

    Args:
        source: a local checkpoint folder or a Hub id (downloaded through huggingface_hub).
        output_dir: the new checkpoint folder (the policy of :func:`hf_posext.files.output_folder`:
            refused when it is the source, inside it, or not empty).
        overwrite: write into a non-empty ``output_dir``: the checkpoint's files are replaced,
            other files are kept.
        extra_files: ``{name: text}`` written into the checkpoint with it (a search's log).
        method, factor, **kwargs: as for :func:`hf_posext.patch_model`.

    Returns:
        ``output_dir`` as a Path.
    """
    source_dir = Path(source)
    if not source_dir.is_dir():
        text = str(source)
        if text.startswith((".", "/", "~")) or text.count("/") != 1:  # a Hub id is "owner/name"
            raise FileNotFoundError(f"no checkpoint folder at {text} (and it is not a Hub id owner/name)")
        source_dir = Path(snapshot_download(str(source)))
    if not (source_dir / "config.json").is_file():
        raise FileNotFoundError(f"{source_dir} has no config.json: not a transformers checkpoint")
    config = read_config(source_dir)
    check_weight_files(source_dir)  # copied byte for byte and vouched for by the completion marker: whole or refused
    patch_model(config, method, factor=factor, **kwargs)
    copied = [
        item for item in source_dir.iterdir() if item.name not in CONFIG_ONLY_FILES and not item.name.startswith(".")
    ]
    owns = (*MODEL_REPO_FILES, *(item.name for item in copied), *(extra_files or {}))
    with output_folder(output_dir, overwrite=overwrite, sources=[source_dir], owns=owns) as tmp:
        for item in copied:
            if item.is_dir():
                shutil.copytree(item, tmp / item.name)
            else:
                shutil.copy2(item, tmp / item.name)
        config.save_pretrained(tmp)
        raise_model_max_length(tmp, patch_info(config)["context_length"])
        model_card(config, base_model=str(source)).save(tmp / "README.md")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(output_dir)


#: PEFT's weights file of a saved adapter, in the order ``PeftModel.from_pretrained`` looks for them.
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_PEFT_PREFIX = "base_model.model."
_LORA_TENSOR = re.compile(r"(.+)\.lora_([AB])\.weight")


def read_adapter(adapter_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config and tensors of the PEFT adapter in ``adapter_dir``, read before any model loads.

    Raises:
        FileNotFoundError: no ``adapter_config.json``, or no weights file beside it (PEFT would
            look for a Hub repository named like the folder instead).
    """
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"no PEFT adapter at {adapter_dir} (it has no adapter_config.json)")
    weights = next((adapter_dir / name for name in ADAPTER_WEIGHTS if (adapter_dir / name).is_file()), None)
    if weights is None:
        raise FileNotFoundError(
            f"the PEFT adapter at {adapter_dir} has no weights: {' or '.join(ADAPTER_WEIGHTS)} is missing"
        )
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if weights.suffix == ".safetensors":
        return config, load_file(weights)
    return config, torch.load(weights, map_location="cpu", weights_only=True)


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
            tensor or layer that does not fit (:func:`check_adapter`). All before anything is written.
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

    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
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
