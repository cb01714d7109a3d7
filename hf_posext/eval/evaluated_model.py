"""Load a checkpoint to evaluate, and fingerprint its content so a result file resumes only on the same model."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..content_digest import file_digest
from ..publish.tokenizer import check_tokenizer_config
from ..gguf import check_model_source, gguf_identity, is_gguf, resolve_model_source
from ..validation.saved_model import check_device, check_weight_files, read_config

DTYPES = ("auto", "float32", "bfloat16", "float16")


def load_model(path: str, dtype: str = "auto", device: str = "auto", attn_implementation: str | None = None):
    """Load a causal LM and its tokenizer for evaluation (eval mode, placed by ``device_map``).

    Args:
        path: checkpoint folder, Hub id or local ``.gguf`` file (see `hf_posext.gguf`).
        dtype: ``auto`` (the checkpoint's), ``float32``, ``bfloat16`` or ``float16``.
        device: ``auto`` (the layers spread over every visible GPU, so a 70B model evaluates on a
            node; CPU without one), or one device: ``cpu``, ``cuda``, ``cuda:1``...
        attn_implementation: e.g. ``sdpa``, ``eager``, ``flash_attention_2``; ``None``: transformers' default.

    Raises:
        ValueError: an unknown dtype or device, a malformed config.json, broken weight files.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kwargs: dict[str, Any] = {"dtype": dtype if dtype == "auto" else getattr(torch, dtype), "device_map": device}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    check_device(device)
    path = resolve_model_source(path)  # a .gguf file -> its cached safetensors conversion
    config = read_config(path)
    check_weight_files(path)
    check_tokenizer_config(path)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


#: Files of a checkpoint folder that do not change what it computes.
_NOT_CONTENT = (".md", ".png", ".csv")


def model_fingerprint(model: str) -> str:
    """What a result file's resume is keyed on: the checkpoint's content, not its path.

    A local folder: a hash of the name and the bytes of every file (weights, tokenizer, config,
    generation config; documents and hidden files excluded), each file's digest cached by its
    inode, size and times (`hf_posext.content_digest.file_digest`), so weights rewritten
    in place are another model while a copied or moved folder resumes. A ``.gguf`` file:
    `hf_posext.gguf.gguf_identity` (its size and the hash of its whole content), marked as read with its
    rope keys (`hf_posext.gguf.reading`). A Hub id:
    the id (its revision is not looked up).
    """
    check_model_source(model)
    folder = Path(model)
    if is_gguf(model) and folder.is_file():
        # "gguf-rope": results from before the loader read the file's rope keys (a patched GGUF evaluated as
        # its unpatched source) are not resumed
        return f"gguf-rope:{gguf_identity(model)}"
    if not folder.is_dir():
        return f"hub:{model}"
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.startswith(".") or path.suffix in _NOT_CONTENT:
            continue
        digest.update(f"{path.name}\0{file_digest(path)}\0".encode())
    return f"sha256:{digest.hexdigest()}"


__all__ = ["DTYPES", "load_model", "model_fingerprint"]
