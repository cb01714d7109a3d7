"""Loading patched checkpoints: [`from_pretrained`][hf_posext.from_pretrained] and the construction hook behind it.

A saved patched checkpoint carries the patch in ``config.hf_posext``. RoPE-only methods need only
their rope type; methods with a surgery need it redone while the model is built, before its
weights are loaded. `on_submodule_registered`, a torch module-registration hook installed by
``import hf_posext``, does that inside a model's ``__init__`` only (the first ``embed_tokens`` or
``rotary_emb`` of a base model whose config carries a record), so plain
``AutoModelForCausalLM.from_pretrained`` works too. [`from_pretrained`][hf_posext.from_pretrained] (and
[`AutoPatchedModelForCausalLM`][hf_posext.AutoPatchedModelForCausalLM]) also checks that the surgery is in place (its
`hf_posext.methods.surgery.Surgery.missing` hook). A record of a method this process has not
registered (a plugin not imported) loads as transformers loads it, with a warning, where its rope types
are transformers' own (`hf_posext.validation.unknown_method`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch.nn as nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from . import integration, readers
from .gguf import resolve_model_source
from .methods.registry import shipped_method, surgery_for
from .patching import CONFIG_KEY, method_from_record, patch_model
from .validation.saved_model import check_checkpoint_file, check_model_config, config_source
from .validation.unknown_method import rope_types_of, unknown_method, warn_unknown_method

_hook_handle: Any = None
_undo_from_config: Any = None


def on_submodule_registered(parent: nn.Module, name: str, submodule: nn.Module) -> nn.Module | None:
    """torch's module-registration hook: redo a method's surgery on a base model being built from a patched config.

    When a base model (``LlamaModel``...) whose config carries an hf-posext record first registers
    ``embed_tokens``, the surgery's ``on_model_init`` runs (absolute encodings re-create their
    position table there, so the saved table is loaded into it); when it first registers
    ``rotary_emb``, the module the surgery's ``on_rotary_init`` returns is registered instead
    (exact dynamic scaling puts its stand-in there). A name already registered on ``parent`` is a
    replacement after construction and is left alone; everything else returns at the first check.
    """
    if name not in ("embed_tokens", "rotary_emb") or name in parent._modules:
        return None
    if name == "embed_tokens" and not isinstance(submodule, nn.Embedding):
        return None
    record = getattr(getattr(parent, "config", None), CONFIG_KEY, None)
    if record is None and name == "embed_tokens":
        record = _adopt_shipped_method(parent.config)
    if record is None:
        return None
    check_model_config(parent.config)  # a hand-edited checkpoint: refused before the model is built on it
    if _unknown_method_loads_as_saved(parent.config):
        if name == "embed_tokens":
            readers.restore_on_load(parent.config)
        return None
    method = method_from_record(record)
    if name == "rotary_emb":
        return surgery_for(method).on_rotary_init(method, parent, submodule)
    readers.restore_on_load(parent.config)  # old rope type names, legacy fields; before the rotary is built
    surgery_for(method).on_model_init(method, parent)
    return None


def _unknown_method_loads_as_saved(config: Any) -> bool:
    """Whether ``config``'s record names a method this process has not registered, which (its rope types being
    transformers' own: `hf_posext.validation.saved_model.check_model_config` refused the others) then
    loads as transformers loads it, with a warning (`hf_posext.validation.unknown_method`)."""
    method = unknown_method(getattr(config, CONFIG_KEY, None))
    if method is not None:
        warn_unknown_method(method, rope_types_of(config), config_source(config))
    return method is not None


def _ships_method(config: Any) -> bool:
    """Whether building a model from ``config`` patches it (`_adopt_shipped_method`)."""
    if getattr(config, CONFIG_KEY, None) is not None:
        return False
    try:
        return shipped_method(config) is not None
    except ValueError:
        return True  # the build raises it, naming the field; the caller's config stays untouched


def _adopt_shipped_method(config: Any) -> dict[str, Any] | None:
    """Patch a config without an hf-posext record with the method a family's load-time hook finds in it.

    The hooks are registered with the families (`hf_posext.methods.registry.shipped_method`;
    DCA adopts Qwen's ``dual_chunk_attention_config``). Returns the new record, or ``None``.

    Raises:
        ValueError: a shipped field the method refuses (the hook names it).
    """
    method = shipped_method(config)
    if method is None:
        return None
    patch_model(config, method)
    return getattr(config, CONFIG_KEY)


def set_construction_hook(enabled: bool) -> None:
    """Install (``True``, what ``import hf_posext`` does) or remove the construction hook.

    With it removed, models built from a patched config that needs surgery come out without it;
    [`from_pretrained`][hf_posext.from_pretrained] then raises instead of returning such a model.
    """
    global _hook_handle, _undo_from_config
    if enabled and _hook_handle is None:
        _hook_handle = nn.modules.module.register_module_module_registration_hook(on_submodule_registered)
        _undo_from_config = integration.copy_config_in_from_config(_ships_method)
    elif not enabled and _hook_handle is not None:
        _hook_handle.remove()
        _hook_handle = None
        _undo_from_config()
        _undo_from_config = None


def from_pretrained(
    pretrained_model_name_or_path: str | os.PathLike, *args: Any, model_class: Any = None, **kwargs: Any
) -> PreTrainedModel:
    """Load a checkpoint saved from an hf-posext-patched model, with its method's surgery redone.

    Args:
        pretrained_model_name_or_path: a local folder or a Hub id, as for transformers, or a local
            ``.gguf`` file (converted once by `hf_posext.gguf.gguf_checkpoint`).
        model_class: the transformers class to load with (``AutoModelForCausalLM`` by default).
        *args, **kwargs: passed to ``model_class.from_pretrained`` (``torch_dtype``, ``device_map``,
            ``attn_implementation``...; for ALiBi, ``attn_implementation="sdpa"`` etc. selects the
            matching ALiBi path; for exact dynamic scaling, the wrapped kernel).

    Returns:
        The model, patched as it was saved (an unpatched checkpoint loads as transformers loads it).

    Raises:
        ValueError: a rope field or record of the checkpoint out of range, non-finite or misshapen
            (`hf_posext.validation.saved_model.check_model_config`), naming the file and the field; a
            record of a method this process has not registered whose rope type is not transformers' own.
        RuntimeError: the method's surgery is missing (the construction hook was switched off).

    Warns:
        UserWarning: a record of a method this process has not registered, on transformers' own rope types:
            the checkpoint loads as transformers loads it.

    Examples:
        >>> model = hf_posext.from_pretrained("out/llama-yarn-16k", torch_dtype="auto")  # doctest: +SKIP
    """
    if model_class is None:
        from transformers import AutoModelForCausalLM  # here: transformers' Auto classes load when used

        model_class = AutoModelForCausalLM
    pretrained_model_name_or_path = resolve_model_source(pretrained_model_name_or_path)  # .gguf -> cached conversion
    if isinstance(pretrained_model_name_or_path, (str, os.PathLike)):
        check_checkpoint_file(pretrained_model_name_or_path)  # before transformers' own reading of the file
    model = model_class.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
    check_model_config(model.config, unknown_types=True)  # a checkpoint without a record too, before it is used
    record = getattr(model.config, CONFIG_KEY, None)
    if isinstance(record, dict) and "method" in record and not _unknown_method_loads_as_saved(model.config):
        method = method_from_record(record)
        missing = surgery_for(method).missing(method, model)
        if missing is not None:
            raise RuntimeError(
                f"{pretrained_model_name_or_path}: the checkpoint was patched with {method.name!r} but the loaded "
                f"model lacks {missing}; call hf_posext.loading.set_construction_hook(True) before loading"
            )
    return model


class AutoPatchedModelForCausalLM:
    """``AutoModelForCausalLM`` for patched checkpoints: [`from_pretrained`][hf_posext.from_pretrained] under the
    Auto-class name.

    Examples:
        >>> model = hf_posext.AutoPatchedModelForCausalLM.from_pretrained("out/llama-yarn-16k")  # doctest: +SKIP
    """

    def __init__(self) -> None:
        raise TypeError(
            "AutoPatchedModelForCausalLM is not instantiated; call AutoPatchedModelForCausalLM.from_pretrained"
        )

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any
    ) -> PreTrainedModel:
        """[`from_pretrained`][hf_posext.from_pretrained] with ``model_class=AutoModelForCausalLM``; same arguments."""
        return from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
