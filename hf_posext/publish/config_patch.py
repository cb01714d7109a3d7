"""Config-only context extension (``hf-posext patch`` on a folder): `patch_checkpoint` loads no weights.

It copies a checkpoint's files byte for byte and rewrites only ``config.json`` and ``README.md``
(`CONFIG_ONLY_FILES`), so extending a 70B model takes seconds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from huggingface_hub import snapshot_download

from ..files import output_folder
from ..patching import patch_info, patch_model
from ..post_import import deprecated_attribute
from ..validation.saved_model import check_weight_files, read_config
from .card import model_card
from .repository import MODEL_REPO_FILES
from .tokenizer import raise_model_max_length


CONFIG_ONLY_FILES = ("config.json", "README.md")


def patch_checkpoint(
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
        output_dir: the new checkpoint folder (the policy of `hf_posext.files.output_folder`:
            refused when it is the source, inside it, or not empty).
        overwrite: write into a non-empty ``output_dir``: the checkpoint's files are replaced,
            other files are kept.
        extra_files: ``{name: text}`` written into the checkpoint with it (a search's log).
        method, factor, **kwargs: as for [`hf_posext.patch_model`][hf_posext.patch_model].

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


def __getattr__(name: str) -> Any:
    """The deprecated ``extend_checkpoint`` (`hf_posext.post_import.RENAMED`)."""
    return deprecated_attribute(__name__, name)


__all__ = ["CONFIG_ONLY_FILES", "patch_checkpoint"]
