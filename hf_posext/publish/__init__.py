"""Checkpoints for others to load: model cards, config-only context extension, adapter merges.

`config_patch` (``hf-posext patch``: a checkpoint's context extended without loading its weights),
`gguf_patch` (the same verb on a GGUF file: its rope rewritten, its tensors copied),
`adapter` (a LoRA fine-tune merged from its base and its adapter), `card` (their model
card), `repository` (the files a model repository holds). Beside them, what travels with an
extended checkpoint: its card's origin and readers table (`hub_card`), its tokenizer's raised
``model_max_length`` (`tokenizer`; the fine-tune recipe writes both too), and the Hub push (`hub`).
"""

from .adapter import ADAPTER_WEIGHTS, check_adapter, merge_adapter, read_adapter
from .card import card_title, model_card
from .config_patch import CONFIG_ONLY_FILES, patch_checkpoint
from .gguf_patch import patch_gguf
from ..post_import import deprecated_attribute as _deprecated_attribute
from .repository import ADAPTER_FOLDER, MODEL_REPO_FILES


def __getattr__(name: str) -> object:  # the deprecated extend_checkpoint (hf_posext.post_import.RENAMED)
    return _deprecated_attribute(__name__, name)


__all__ = [
    "ADAPTER_FOLDER",
    "ADAPTER_WEIGHTS",
    "CONFIG_ONLY_FILES",
    "MODEL_REPO_FILES",
    "card_title",
    "check_adapter",
    "merge_adapter",
    "model_card",
    "patch_checkpoint",
    "patch_gguf",
    "read_adapter",
]
