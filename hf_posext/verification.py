"""Does a model in memory run what its config says? `verify` lists where it does not.

    mismatches = hf_posext.verify(model)     # [] when the live modules compute the config's rope
    for mismatch in mismatches:
        print(mismatch)                      # model.rotary_emb: inv_freq: the config says [...] (yarn); found [...]

A rotary embedding computes its frequencies once, when it is built: a rope written into
``config.rope_parameters`` afterwards (by a training script, a serving wrapper, a hand) is a no-op,
and nothing says so. `verify` recomputes, for each rotary module and each of its layer types,
what transformers' rope functions (hf-posext's registered ones included) give for the config, and
compares it with the module's ``inv_freq`` and ``attention_scaling``; it then asks the recorded
method's surgery (``config.hf_posext``) whether its attention or modules are in place. It works on
any model: patched by hf-posext, plain transformers, or changed by another program. Run it in a
training or serving script before the first step; ``hf-posext doctor --live PATH`` runs it on a
checkpoint as loaded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from . import integration
from .methods.registry import surgery_for
from .patching import CONFIG_KEY, method_from_record
from .rope_utils import REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY


@dataclass(frozen=True)
class Mismatch:
    """One place where a live model does not compute what its config says.

    Attributes:
        module: the qualified name of the module (``model.rotary_emb``), or ``""`` for the model.
        layer_type: the layer type of per-layer-type rope parameters (``sliding_attention``), else ``None``.
        field: what differs: ``rope_type``, ``inv_freq``, ``attention_scaling``, ``surgery``, or ``config`` (a
            rope type no function computes, a record naming no method, a model config replaced after
            construction while the module reads the one it was built with).
        expected: what the config says, in words.
        found: what the module holds, in words.
    """

    module: str
    layer_type: str | None
    field: str
    expected: str
    found: str

    def __str__(self) -> str:
        where = (self.module or "model") + (f"[{self.layer_type}]" if self.layer_type else "")
        return f"{where}: {self.field}: the config says {self.expected}; found {self.found}"


def _tensor_words(values: torch.Tensor) -> str:
    flat = values.detach().double().flatten().cpu().tolist()
    shown = ", ".join(f"{v:.6g}" for v in flat[:3]) + (", ..." if len(flat) > 3 else "")
    return f"[{shown}] ({len(flat)} values)"


def _expected(
    module: nn.Module, config: Any, rope_type: str, layer_type: str | None
) -> tuple[list[torch.Tensor], float]:
    """What the module's ``__init__`` computes for ``config`` (transformers' or hf-posext's rope function): the
    frequency sets it may hold (LongRoPE: short and long, switched by length) and the attention scaling."""
    kwargs: dict[str, Any] = {} if layer_type is None else {"layer_type": layer_type}
    if rope_type == "default" and hasattr(module, "compute_default_rope_parameters"):
        init = module.compute_default_rope_parameters
    else:
        init = integration.rope_init_function(rope_type)
    inv_freq, scaling = init(config, device="cpu", **kwargs)
    sets = [inv_freq]
    if "longrope" in rope_type:
        original = int(
            (config.rope_parameters.get(layer_type) if layer_type else config.rope_parameters)[
                "original_max_position_embeddings"
            ]
        )
        sets.append(init(config, device="cpu", seq_len=original + 1, **kwargs)[0])
    return sets, float(scaling)


def _effective(rope_type: str, entry: dict[str, Any]) -> str:
    """The rope type a module runs: the remapping methods keep the checkpoint's own type under their marker
    (`hf_posext.rope_utils.REMAP_ROPE_TYPE`), which computes the same frequencies."""
    return str(entry.get(REMAPPED_TYPE_KEY, "default")) if rope_type == REMAP_ROPE_TYPE else rope_type


def _grown(module: nn.Module, rope_type: str) -> bool:
    """Whether a dynamic rope has moved its ``inv_freq`` past the set it was built with (a long sequence)."""
    return "dynamic" in rope_type and getattr(module, "max_seq_len_cached", 0) > getattr(
        module, "original_max_seq_len", float("inf")
    )


def _close(found: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal up to the rounding of ``found``'s dtype (a bf16 model holds its frequencies rounded to bf16)."""
    if found.shape != expected.shape:
        return False
    found = found.detach().cpu()
    eps = torch.finfo(found.dtype).eps if found.is_floating_point() else 0.0
    return torch.allclose(found.double(), expected.to(found.dtype).double(), rtol=4 * eps, atol=0.0)


def _rotary_mismatches(name: str, module: nn.Module) -> list[Mismatch]:
    config = module.config
    params = config.rope_parameters or {}
    per_type = isinstance(module.rope_type, dict)
    if per_type:
        entries = [(layer_type, (params.get(layer_type) or {}).get("rope_type")) for layer_type in module.rope_type]
    else:
        entries = [(None, params.get("rope_type"))]
    found: list[Mismatch] = []
    for layer_type, rope_type in entries:
        held = module.rope_type[layer_type] if per_type else module.rope_type
        if rope_type is None:
            found.append(Mismatch(name, layer_type, "rope_type", "no rope_type", f"a module built as {held!r}"))
            continue
        entry = (params.get(layer_type) or {}) if per_type else params
        if _effective(held, entry) != _effective(rope_type, entry):
            found.append(Mismatch(name, layer_type, "rope_type", repr(rope_type), f"a module built as {held!r}"))
        try:
            sets, scaling = _expected(module, config, rope_type, layer_type)
        except (KeyError, ValueError, TypeError, ZeroDivisionError) as err:
            detail = "an unregistered rope type" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            said, computed = f"rope_type {rope_type!r}", f"no rope computed from it ({detail})"
            found.append(Mismatch(name, layer_type, "config", said, computed))
            continue
        prefix = f"{layer_type}_" if per_type else ""
        buffer = getattr(module, f"{prefix}inv_freq")
        if _grown(module, rope_type):  # the live set moves with the length; the one it was built with does not
            buffer = getattr(module, f"{prefix}original_inv_freq", buffer)
        if not any(_close(buffer, inv_freq) for inv_freq in sets):
            said = " or ".join(_tensor_words(inv_freq) for inv_freq in sets)
            found.append(Mismatch(name, layer_type, "inv_freq", f"{said} ({rope_type})", _tensor_words(buffer)))
        held_scaling = getattr(module, f"{prefix}attention_scaling", None)
        if held_scaling is not None and not _grown(module, rope_type):
            value = float(held_scaling)
            if abs(value - scaling) > 1e-6 * max(1.0, abs(scaling)):
                said = f"{scaling:.6g} ({rope_type})"
                found.append(Mismatch(name, layer_type, "attention_scaling", said, f"{value:.6g}"))
    return found


def _surgery_mismatches(model: nn.Module, config: Any) -> list[Mismatch]:
    record = getattr(config, CONFIG_KEY, None)
    if not isinstance(record, dict) or "method" not in record:
        return []
    try:
        method = method_from_record(record)
    except (ValueError, TypeError) as err:
        return [Mismatch("", None, "config", f"the hf_posext record {record.get('method')!r}", f"no method ({err})")]
    missing = surgery_for(method).missing(method, model)
    if missing is None:
        return []
    return [Mismatch("", None, "surgery", f"method {method.name!r} (config.{CONFIG_KEY})", f"{missing} missing")]


def verify(model: nn.Module) -> list[Mismatch]:
    """The mismatches between what ``model``'s config says and what its live modules compute.

    For every rotary embedding module (each layer type of per-layer-type rope parameters): its
    ``rope_type``, ``inv_freq`` (for dynamic and LongRoPE modules that have grown past their
    original length, the set they were built with) and ``attention_scaling`` against what the
    config's rope function computes; then, for a config with an hf-posext record, whether the
    method's surgery (remapped or ALiBi attention, position tables, wrapped rotary modules) is in
    place. A frequency is equal up to the rounding of the buffer's dtype.

    Args:
        model: a transformers model (a PEFT model is looked through), built from any source.

    Returns:
        The mismatches, in module order; ``[]`` when the model runs its config.

    Examples:
        >>> model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}  # after construction
        >>> [m.field for m in hf_posext.verify(model)]
        ['rope_type', 'inv_freq', 'attention_scaling']
    """
    with contextlib.suppress(AttributeError, TypeError):
        model = model.get_base_model()  # type: ignore[operator]
    mismatches: list[Mismatch] = []
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name, module in integration.rotary_modules(model):
        own = module.config
        # a config replaced (not edited) on the model: the module still reads the one it was built with
        if own is not text and type(own) is type(text) and own.rope_parameters != text.rope_parameters:
            said, held = f"rope_parameters {text.rope_parameters}", f"a module reading {own.rope_parameters}"
            mismatches.append(Mismatch(name, None, "config", said, held))
        mismatches += _rotary_mismatches(name, module)
    if config is not None:
        mismatches += _surgery_mismatches(model, config)
    return mismatches


__all__ = ["Mismatch", "verify"]
