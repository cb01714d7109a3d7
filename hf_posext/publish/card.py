"""The Hub model card (README.md with YAML metadata) of a patched checkpoint: `model_card`, `card_title`.

Its base model and readers table come from `hub_card`.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..methods import method_class
from ..patching import patch_info
from ..readers import support
from .hub_card import base_model_id, readers_section


def model_card(config: Any, base_model: str | None = None, extra: dict[str, Any] | None = None) -> ModelCard:
    """A Hub model card (README.md with YAML metadata) describing the patch ``config`` carries.

    Args:
        config: a patched transformers config.
        base_model: the Hub id or path of the checkpoint that was extended; the card names only
            its Hub id (`hf_posext.publish.hub_card.base_model_id`), never a local path.
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
    extended = info.get("layer_types")
    if extended:
        what += f" in its {', '.join(f'`{key}`' for key in extended)} layers (the other layer types kept as they were)"
    if info.get("composed_on"):
        params = info["rope_parameters"]
        saved = {params[key]["rope_type"] for key in extended} if extended else {params["rope_type"]}
        what += (
            f", composed on its own `{info['composed_on']}` rope scaling ({original} tokens is what that scaling "
            f"already reached; `{method}` extends it; saved as rope_type {', '.join(f'`{t}`' for t in sorted(saved))})"
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


__all__ = ["card_title", "model_card"]
