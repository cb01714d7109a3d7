"""The tokenizer's ``model_max_length`` (``tokenizer_config.json``) in an extended checkpoint.

:func:`raise_model_max_length` raises a limit below the patch's context (transformers' tokenizers
truncate to it); higher limits are kept (docs/readers/index.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TOKENIZER_CONFIG = "tokenizer_config.json"


def raise_model_max_length(folder: str | os.PathLike, context: int | None) -> int | None:
    """Raise ``model_max_length`` in ``folder``'s tokenizer_config.json to ``context`` when it is lower.

    Args:
        folder: a checkpoint folder being written (the file is rewritten in place: call it on the
            temporary folder of :func:`hf_posext.files.output_folder`, never on a source).
        context: the patched model's context; ``None`` (no fixed context, e.g. ALiBi) changes nothing.

    Returns:
        The old limit when it was raised, else ``None`` (no file, no numeric limit, or one already
        at least ``context``).
    """
    path = Path(folder) / TOKENIZER_CONFIG
    if context is None or not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    old = data.get("model_max_length")
    if isinstance(old, bool) or not isinstance(old, (int, float)) or old >= context:
        return None
    data["model_max_length"] = int(context)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return old
