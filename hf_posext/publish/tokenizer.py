"""The tokenizer's ``model_max_length`` (``tokenizer_config.json``) in an extended checkpoint.

`raise_model_max_length` raises a limit below the patch's context (transformers' tokenizers
truncate to it); higher limits are kept (docs/readers/index.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TOKENIZER_CONFIG = "tokenizer_config.json"


def _read(path: Path) -> dict:
    """``tokenizer_config.json``'s object, its ``model_max_length`` checked (None or a positive number).

    Raises:
        ValueError: not a JSON object, or a limit that is no positive number, naming the file and field.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    old = data.get("model_max_length")
    if old is not None and (isinstance(old, bool) or not isinstance(old, (int, float)) or not old > 0):  # nan too
        raise ValueError(
            f"{path}: model_max_length must be a positive number (or absent: no limit), got {old!r}; "
            "the tokenizer compares lengths with it"
        )
    return data


def check_tokenizer_config(folder: str | os.PathLike) -> None:
    """Refuse, before any work, a ``tokenizer_config.json`` in ``folder`` that `raise_model_max_length` would.

    Raises:
        ValueError: as `raise_model_max_length`.
    """
    path = Path(folder) / TOKENIZER_CONFIG
    if path.is_file():
        _read(path)


def raise_model_max_length(folder: str | os.PathLike, context: int | None) -> int | None:
    """Raise ``model_max_length`` in ``folder``'s tokenizer_config.json to ``context`` when it is lower.

    Args:
        folder: a checkpoint folder being written (the file is rewritten in place: call it on the
            temporary folder of `hf_posext.files.output_folder`, never on a source).
        context: the patched model's context; ``None`` (no fixed context, e.g. ALiBi) changes nothing.

    Returns:
        The old limit when it was raised, else ``None`` (no file, no limit, or one already at least
        ``context``).

    Raises:
        ValueError: a file that is no JSON object, or a ``model_max_length`` that is no positive
            number (a string, a boolean, nan, <= 0), naming the file and the field.
    """
    path = Path(folder) / TOKENIZER_CONFIG
    if context is None or not path.is_file():
        return None
    data = _read(path)
    old = data.get("model_max_length")
    if old is None or old >= context:
        return None
    data["model_max_length"] = int(context)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return old
