"""Loading patched checkpoints: :func:`from_pretrained` and the construction hook behind it.

A checkpoint saved from a patched model carries the patch in ``config.hf_posext``. For RoPE-only
methods (``linear``, ``ntk``, ``yarn``) the saved ``rope_parameters`` are all there is, and
transformers' own ``from_pretrained`` rebuilds the model through ``ROPE_INIT_FUNCTIONS`` (after
``import hf_posext`` has registered hf-posext's rope types). Methods with an adapter need their
surgery redone while the model is built, before its weights are loaded: ALiBi's attention path,
the absolute encodings' position table (the learned one is then loaded from the checkpoint), the
dynamic methods' exact KV-cache wrapper.

That is done by :func:`on_submodule_registered`, a torch module-registration hook that acts only
inside a model's ``__init__``: when a module whose config carries an hf-posext record registers
``embed_tokens`` or ``rotary_emb`` for the *first* time. Replacing either later
(``resize_token_embeddings``, ``set_input_embeddings``, :func:`~hf_posext.patch_model`'s own rotary
swaps) never triggers it. ``import hf_posext`` installs it, so plain
``AutoModelForCausalLM.from_pretrained`` keeps working; it is not removed because a ``dynamic_ntk``
checkpoint carries transformers' native ``dynamic`` rope type, and nothing else at load time could
tell transformers to build the exact wrapper instead of silently running its stale-cache
behaviour. :func:`from_pretrained` is the explicit loader (as ``PeftModel.from_pretrained``): it
loads, then checks that the method's surgery is in place, and raises if the hook was switched off
with :func:`set_construction_hook`.
"""

from __future__ import annotations

import os
from typing import Any

import torch.nn as nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from . import readers
from .adapters import adapter_for, needs_surgery
from .adapters.absolute import POSITIONS_ATTR
from .attention.alibi import ALIBI_ATTENTION
from .exact_dynamic import EXACT_ROPE_TYPES, ExactDynamicRotaryEmbedding
from .gguf import resolve_model_source
from .methods.absolute import LearnedConfig, SinusoidalConfig
from .methods.alibi import AlibiConfig
from .methods.base import PositionMethod
from .methods.dynamic import DynamicScaling
from .methods.dca import DualChunkConfig
from .patching import CONFIG_KEY, method_from_record, patch_model

_hook_handle: Any = None


def on_submodule_registered(parent: nn.Module, name: str, submodule: nn.Module) -> nn.Module | None:
    """torch's module-registration hook: redo a method's surgery on a base model being built from a patched config.

    When a base model (``LlamaModel``...) whose config carries an hf-posext record first registers
    ``embed_tokens``, the adapter's ``on_model_init`` runs (absolute encodings re-create their
    position table there, so the saved table is loaded into it); when it first registers
    ``rotary_emb``, the module the adapter's ``on_rotary_init`` returns is registered instead
    (exact dynamic scaling puts its stand-in there). A name already registered on ``parent`` is a
    replacement after construction and is left alone; everything else returns at the first check.
    """
    if name not in ("embed_tokens", "rotary_emb") or name in parent._modules:
        return None
    if name == "embed_tokens" and not isinstance(submodule, nn.Embedding):
        return None
    record = getattr(getattr(parent, "config", None), CONFIG_KEY, None)
    if record is None and name == "embed_tokens":
        record = _adopt_dual_chunk_config(parent.config)
    if not isinstance(record, dict) or "method" not in record:
        return None
    method = method_from_record(record)
    if name == "rotary_emb":
        return adapter_for(method).on_rotary_init(method, parent, submodule)
    readers.restore_on_load(parent.config)  # old rope type names, legacy fields; before the rotary is built
    adapter_for(method).on_model_init(method, parent)
    return None


def _adopt_dual_chunk_config(config: Any) -> dict[str, Any] | None:
    """Patch, with ``dca``, a config that ships ``dual_chunk_attention_config`` and no hf-posext record.

    Qwen2.5-7B/14B-Instruct-1M (and Qwen3 2507's 1M configs) carry vLLM's field
    ``{chunk_size, local_size, original_max_position_embeddings}``, which transformers ignores: the
    model would run plain RoPE far past its chunk size. The config keeps its advertised context.
    """
    fields = getattr(config, "dual_chunk_attention_config", None)
    if not isinstance(fields, dict) or "chunk_size" not in fields:
        return None
    chunk = int(fields["chunk_size"])
    original = int(fields.get("original_max_position_embeddings") or chunk)
    local = fields.get("local_size")
    factor = max(1.0, int(config.max_position_embeddings) / original)
    patch_model(config, DualChunkConfig(factor=factor, original_max_position_embeddings=original, chunk_size=chunk,
                                        local_size=None if local is None else int(local)))
    return getattr(config, CONFIG_KEY)


def set_construction_hook(enabled: bool) -> None:
    """Install (``True``, what ``import hf_posext`` does) or remove the construction hook.

    With it removed, models built from a patched config that needs surgery come out without it;
    :func:`from_pretrained` then raises instead of returning such a model.
    """
    global _hook_handle
    if enabled and _hook_handle is None:
        _hook_handle = nn.modules.module.register_module_module_registration_hook(on_submodule_registered)
    elif not enabled and _hook_handle is not None:
        _hook_handle.remove()
        _hook_handle = None


def _surgery_missing(method: PositionMethod, model: nn.Module) -> str | None:
    """What of ``method``'s surgery ``model`` lacks, in words, or ``None``."""
    if isinstance(method, (SinusoidalConfig, LearnedConfig)):
        if not any(POSITIONS_ATTR in m._modules for m in model.modules()):
            return f"the position table ({POSITIONS_ATTR})"
    elif isinstance(method, AlibiConfig):
        if model.config._attn_implementation != ALIBI_ATTENTION:
            return f"the ALiBi attention ({ALIBI_ATTENTION})"
    elif isinstance(method, DynamicScaling) and method.exact_cache:
        rope_type = (model.config.rope_parameters or {}).get("rope_type")
        stand_in = any(isinstance(m, ExactDynamicRotaryEmbedding) for m in model.modules())
        if rope_type in EXACT_ROPE_TYPES and not stand_in:
            return "the exact KV-cache wrapper"
    return None


def from_pretrained(
    pretrained_model_name_or_path: str | os.PathLike, *args: Any, model_class: Any = AutoModelForCausalLM, **kwargs: Any
) -> PreTrainedModel:
    """Load a checkpoint saved from an hf-posext-patched model, with its method's surgery redone.

    Args:
        pretrained_model_name_or_path: a local folder or a Hub id, as for transformers, or a local
            ``.gguf`` file (converted once by :func:`hf_posext.gguf.gguf_checkpoint`).
        model_class: the transformers class to load with (``AutoModelForCausalLM`` by default).
        *args, **kwargs: passed to ``model_class.from_pretrained`` (``torch_dtype``, ``device_map``,
            ``attn_implementation``...; for ALiBi, ``attn_implementation="sdpa"`` etc. selects the
            matching ALiBi path; for exact dynamic scaling, the wrapped kernel).

    Returns:
        The model, patched as it was saved (an unpatched checkpoint loads as transformers loads it).

    Raises:
        RuntimeError: the method's surgery is missing (the construction hook was switched off).

    Example:
        >>> model = hf_posext.from_pretrained("out/llama-yarn-16k", torch_dtype="auto")
    """
    pretrained_model_name_or_path = resolve_model_source(pretrained_model_name_or_path)  # .gguf -> cached conversion
    model = model_class.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
    record = getattr(model.config, CONFIG_KEY, None)
    if isinstance(record, dict) and "method" in record:
        method = method_from_record(record)
        missing = _surgery_missing(method, model) if needs_surgery(method) else None
        if missing is not None:
            raise RuntimeError(
                f"{pretrained_model_name_or_path}: the checkpoint was patched with {method.name!r} but the loaded "
                f"model lacks {missing}; call hf_posext.loading.set_construction_hook(True) before loading"
            )
    return model
