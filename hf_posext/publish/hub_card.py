"""What a model card says about the checkpoint's origin and its readers.

A card is published: it never names a local folder (a path says nothing to a Hub visitor and can
leak a user name). ``base_model`` is a Hub id or nothing (the Hub links it and builds the model
tree from it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from huggingface_hub import ModelCard

# owner/name as the Hub accepts them (huggingface_hub's validate_repo_id, without the length cap)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# huggingface_hub's cache layout: .../models--owner--name/snapshots/<revision>
_CACHE_DIR = re.compile(r"models--([\w.-]+?)--([\w.-]+)$")


def looks_like_hub_id(text: str) -> bool:
    """``owner/name``, and not a path that exists here."""
    return bool(_HUB_ID.match(text)) and ".." not in text and not os.path.exists(text)


def base_model_id(source: str | os.PathLike | None) -> str | None:
    """The Hub id of the checkpoint ``source`` names, or ``None`` when it cannot be told.

    In order: ``source`` itself; a folder in huggingface_hub's cache (``models--owner--name``); the
    ``_name_or_path`` its config.json records (configs saved by transformers 4.x do); the
    ``base_model`` of its own card when that card is an hf-posext card (re-patching starts from the
    checkpoint's own rope, so the result extends that same base model).
    """
    if source is None:
        return None
    text = str(source)
    if looks_like_hub_id(text):
        return text
    folder = Path(text)
    if not folder.is_dir():
        return None
    for part in (folder.resolve(), *folder.resolve().parents):
        match = _CACHE_DIR.match(part.name)
        if match:
            return f"{match.group(1)}/{match.group(2)}"
    config = folder / "config.json"
    if config.is_file():
        name = json.loads(config.read_text()).get("_name_or_path")
        if isinstance(name, str) and looks_like_hub_id(name):
            return name
    readme = folder / "README.md"
    if readme.is_file():
        data = ModelCard.load(readme).data
        base = data.base_model if "hf-posext" in (data.tags or []) else None
        if isinstance(base, str) and looks_like_hub_id(base):
            return base
    return None


def readers_section(verdicts: dict[str, tuple[str, str]]) -> str:
    """The card's "Readers" table: which programs read this checkpoint as transformers 5 does."""
    marks = {"same": "yes", "refused": "no (refuses it)", "misread": "**no: runs it wrong**"}
    rows = "\n".join(f"| {reader} | {marks[status]} | {how} |" for reader, (status, how) in verdicts.items())
    return (
        "## Readers\n\n"
        "Which programs run this checkpoint as it was patched (hf-posext applies each one's rules "
        "to this config.json):\n\n"
        f"| reader | reads it right | how |\n|---|---|---|\n{rows}\n"
    )
