"""GGUF files as model sources: converted once into a cached safetensors checkpoint.

`gguf_checkpoint` dequantizes through transformers into an fp32 safetensors folder keyed
on the file's identity, usable wherever a model goes (docs/results/real_model.md).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import huggingface_hub
import torch
from huggingface_hub.errors import HfHubHTTPError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ..content_digest import HASH_CHUNK as HASH_CHUNK  # re-exported by hf_posext.gguf
from ..content_digest import file_digest
from .. import files
from ..files import atomic_directory, verify_folder
from ..validation import path_shape, require
from .reader import _value, architecture, check_model_keys, open_gguf

logger = logging.getLogger("hf_posext")

#: The file in a converted checkpoint recording which GGUF file it came from.
SOURCE_RECORD = "gguf_source.json"


def is_gguf(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a GGUF file (by its suffix; the file need not exist)."""
    return str(source).lower().endswith(".gguf")


def default_cache_dir() -> Path:
    """``$HF_POSEXT_CACHE/gguf``, else ``~/.cache/hf_posext/gguf``."""
    return files.default_cache_dir() / "gguf"


def _gguf_file(path: str | os.PathLike) -> Path:
    file = Path(path).expanduser()
    if not is_gguf(file):
        raise ValueError(f"expected a .gguf file, got {str(path)!r}")
    if not file.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    return file.resolve()


def gguf_identity(path: str | os.PathLike) -> str:
    """A 16-hex-digit key of the file's whole content (its size and SHA-256), read in 8 MiB chunks.

    Every byte counts: a file rewritten in place (one tensor changed) is another model, and the
    cached conversion and eval's resume fingerprint are keyed on this. 0.18-0.25 s for the 98 MB
    SmolLM2 file here, once per version of the file (`hf_posext.content_digest.file_digest`).
    """
    file = _gguf_file(path)
    return file_digest(file, prefix=str(file.stat().st_size).encode())[:16]


def cached_checkpoint_path(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `gguf_checkpoint` keeps the conversion of ``path`` (it may not exist yet)."""
    file = _gguf_file(path)
    return Path(cache_dir or default_cache_dir()) / f"{file.stem}-{gguf_identity(file)}"


def _check_complete(file: Path) -> None:
    """Refuse a GGUF without head counts or layer tensors before transformers reads it (its errors on such a
    file, a ``TypeError`` or a ``RuntimeError``, name neither the file nor what it lacks)."""
    check_model_keys(open_gguf(file), file)


def load_gguf(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, Any]:
    """transformers' own reading of a GGUF file: the dequantized model and the tokenizer.

    Raises:
        MissingExtra: the ``gguf`` package is missing (``pip install hf-posext[gguf]``).
        FileNotFoundError: no such file.
        ValueError: a file transformers cannot read (truncated, damaged, no head count or layer tensors...),
            naming it.
    """
    file = _gguf_file(path)
    require("gguf", "gguf", f"reading {file.name}")  # transformers needs it; fail with the install line instead
    reader = open_gguf(file)
    check_model_keys(reader, file)  # as `_check_complete`, on the reader `_take_head_dim` reads too
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # ``import hf_posext`` stays light

        config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
        _take_head_dim(config, reader)
        model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, config=config, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (ValueError, struct.error, KeyError, IndexError, EOFError) as err:
        # raised deep inside the reader ("cannot reshape array of size ..."), naming neither the file nor why
        raise ValueError(
            f"{file} cannot be read as a GGUF model ({file.stat().st_size} bytes: truncated, damaged, or a model "
            f"transformers cannot read): {type(err).__name__}: {err}"
        ) from err
    return model, tokenizer


def _take_head_dim(config: Any, reader: Any) -> None:
    """Give ``config`` the file's ``attention.key_length`` as ``head_dim`` where transformers' GGUF reader leaves the
    config class's default (transformers 5.25 maps it for qwen3_moe but not for qwen3, whose default is 128: a Qwen3
    GGUF with other heads was built with the wrong shapes and refused, run: the reader matrix's Qwen3 row)."""
    key_length = _value(reader, f"{architecture(reader)}.attention.key_length")
    if key_length is not None and getattr(config, "head_dim", None) is not None:
        config.head_dim = int(key_length)


def save_checkpoint(
    model: PreTrainedModel, tokenizer: Any, output_dir: str | os.PathLike, record: dict[str, Any] | None = None
) -> Path:
    """Write a GGUF-loaded ``model`` and its tokenizer as a plain safetensors checkpoint, atomically.

    The model is rebuilt from its config without ``quantization_config`` (which makes
    transformers refuse to save it and would make the checkpoint look quantized) and given the
    same tensors, so the saved weights are the dequantized GGUF weights bit for bit.

    Args:
        model: a model from `load_gguf`.
        tokenizer: its tokenizer.
        output_dir: the checkpoint folder, replaced in one rename.
        record: written as ``gguf_source.json`` (which file it came from).
    """
    config = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    from transformers import AutoModelForCausalLM

    # No random initialisation of 135M+ parameters that load_state_dict overwrites at once.
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    with atomic_directory(output_dir) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_RECORD).write_text(json.dumps(record or {}, indent=2) + "\n")
    return Path(output_dir)


def gguf_checkpoint(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The safetensors checkpoint folder of a GGUF file, converted on first use and cached.

    Args:
        path: a local ``.gguf`` file.
        cache_dir: where conversions live; default ``$HF_POSEXT_CACHE/gguf`` or ``~/.cache/hf_posext/gguf``.

    The conversion's config runs the file's rope as llama.cpp does (its ``rope.scaling.*`` keys and
    ``rope_freqs`` tensor, which transformers' GGUF reader drops: `hf_posext.gguf.reading`), so a
    GGUF that ``hf-posext patch`` extended loads as the patched model.

    Returns:
        A folder ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` read.

    Raises:
        ValueError: ``path`` is not a ``.gguf`` file name, or not a complete model (no head count, no layer
            tensors); rope keys hf-posext cannot run (naming the file and the key).
        FileNotFoundError: no such file.
        MissingExtra: the ``gguf`` package is missing.
    """
    file = _gguf_file(path)
    require("gguf", "gguf", f"reading {file.name}")
    _check_complete(file)  # before its digest is cached: a partial file leaves nothing behind
    from .reading import gguf_rope_parameters  # here: it loads transformers' config classes (test_import_cost.py)

    rope = gguf_rope_parameters(file)  # a rope hf-posext cannot run is refused before a minute of dequantizing
    read = None if rope is None else rope.record()
    folder = cached_checkpoint_path(file, cache_dir)
    if folder.exists():
        # The completion marker lists every file's size: a deleted or truncated file (or no marker)
        # means the cache cannot vouch for its weights, and an output copied from it would.
        damage = verify_folder(folder) or (
            None if (folder / SOURCE_RECORD).is_file() else f"{SOURCE_RECORD} is missing"
        )
        if damage is None:
            if _recorded_rope(folder) == read:
                return folder
            damage = "converted before hf-posext read the file's rope keys"
        logger.warning(
            "the cached conversion %s of %s cannot be used (%s): converting it again", folder, file.name, damage
        )
    model, tokenizer = load_gguf(file)
    if rope is not None:
        rope.apply(model.config)
    record = {"gguf_file": str(file), "size": file.stat().st_size, "identity": gguf_identity(file), "rope": read}
    return save_checkpoint(model, tokenizer, folder, record)


def _recorded_rope(folder: Path) -> Any:
    """The rope reading a cached conversion recorded (``"missing"`` for one from before the rope was read)."""
    try:
        return json.loads((folder / SOURCE_RECORD).read_text()).get("rope", "missing")
    except (OSError, ValueError, AttributeError):
        return "missing"


def check_model_source(source: str | os.PathLike, what: str = "model") -> None:
    """Refuse a local path that does not exist before anything reads it as a Hub id.

    A source that can only be a path (`hf_posext.validation.path_shape`) and names nothing
    here would otherwise go to the Hub and fail seconds later with a network error naming no path.

    Raises:
        FileNotFoundError: naming ``source`` and why it is a path.
    """
    text = str(source)
    if os.path.exists(os.path.expanduser(text)):
        return
    reason = path_shape(text)
    if reason is not None:
        raise FileNotFoundError(
            f"{what} {text!r} does not exist (a local path: {reason}); "
            "give an existing checkpoint folder or .gguf file, or a Hub id as org/name"
        )
    _check_hub_answers(text, what)


def _check_hub_answers(repo_id: str, what: str) -> None:
    """Refuse at once a name that is no local path when the Hub cannot be asked about it (one request, 10 s).

    Without this, transformers' downloads retry for 30-40 s with the network down before an error that
    names no local path; a mistyped relative path (``models/llama`` for ``./models/llama``) looks like a Hub id.
    The Hub answering anything (a 404, a gated repo) leaves the error to transformers.

    Raises:
        FileNotFoundError: naming the local path looked for and why the Hub was not asked.
    """
    local = f"{what} {repo_id!r} is no local path (nothing at {os.path.abspath(os.path.expanduser(repo_id))})"
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str):
            return
        raise FileNotFoundError(f"{local}, and as a Hub id it is not in the cache with HF_HUB_OFFLINE set")
    try:
        huggingface_hub.model_info(repo_id, timeout=10)
    except HfHubHTTPError:
        return  # the Hub answered: transformers says what it said
    except Exception as error:  # no network: the client's own connection errors (httpx's), not OSError alone
        if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str):
            return  # cached: transformers reads it without the network
        raise FileNotFoundError(
            f"{local}, and the Hub did not answer to look it up as a Hub id ({type(error).__name__}: {error})"
        ) from None


def resolve_model_source(source: str | os.PathLike) -> str:
    """``source`` itself, or for a ``.gguf`` file the folder of its cached conversion.

    Raises:
        FileNotFoundError: a path-shaped source that does not exist (`check_model_source`).
    """
    check_model_source(source)
    return str(gguf_checkpoint(source)) if is_gguf(source) else str(source)
