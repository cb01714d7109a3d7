"""The model-type sweep: every rotary decoder of the installed transformers, patched by each method family.

For each registry candidate (scripts/registry.py) that builds as a tiny model: the first method of
each family in :data:`SWEPT_FAMILIES` is applied; it either patches or is refused with one
``ValueError`` (any other exception is a bug the sweep reports). A patched model's forward past L0 must be
finite; it is saved, and :func:`read_back` reloads every saved checkpoint: in one interpreter without
hf_posext (scripts/vanilla.py) where transformers reads it natively, else with
``hf_posext.from_pretrained``, after doctor said it needs the plugin. benchmarks/model_sweep.py writes the
outcomes into benchmarks/results/model_sweep.json, which docs/methods/supported.md shows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

import hf_posext
from hf_posext.methods.registry import families
from scripts.registry import L_ORIG, candidates, tiny_model
from scripts.vanilla import vanilla_load_errors, vanilla_logits

FACTOR = 2
#: Arguments a family's first method needs beyond ``factor`` on the tiny models (L0 = 64).
ARGUMENTS = {"longrope": {"exact_cache": False}, "self_extend": {"window_size": 16}}
#: The families the CI sweep applies: the rope scalings and one attention-level remapping (each model type
#: times every family costs ~1.5 s on 2 cores; the other families run on four architectures elsewhere).
SWEPT_FAMILIES = ("linear", "ntk", "yarn", "longrope", "self_extend")


def sweep_methods() -> list[str]:
    """The first method (the static one) of each swept family."""
    return [family.methods[0] for name, family in families().items() if name in SWEPT_FAMILIES]


@dataclasses.dataclass
class Outcome:
    """One model type under one method: ``status`` is ``"native"``, ``"plugin"`` or ``"refused"``."""

    model_type: str
    method: str
    status: str
    why: str = ""


def ids(length: int = L_ORIG + 16) -> torch.Tensor:
    return torch.randint(0, 97, (1, length), generator=torch.Generator().manual_seed(0))


def patch_all(
    folder: Path, model_types: tuple[str, ...] | None = None
) -> tuple[list[Outcome], dict[Path, torch.Tensor], list[tuple[str, str]]]:
    """Patch every buildable candidate (or ``model_types``) with every sweep method; save what patched.

    Returns:
        ``(outcomes of refusals, {checkpoint: logits past L0}, [(model_type, why) not buildable tiny])``;
        each checkpoint folder is ``folder / f"{model_type}--{method}"``.
    """
    refused, saved, unbuildable = [], {}, []
    sequence = ids()
    for model_type in candidates() if model_types is None else model_types:
        try:
            tiny_model(model_type)(sequence[:, :8])
        except Exception as error:  # the registry's defaults do not shrink to a working tiny model
            unbuildable.append((model_type, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"))
            continue
        model = tiny_model(model_type)
        for method in sweep_methods():  # each patch replaces the previous one: patches never stack
            kwargs = dict(ARGUMENTS.get(method, {}))
            if hf_posext.methods.method_class(method).takes_factor:
                kwargs["factor"] = FACTOR
            try:
                hf_posext.patch_model(model, method, **kwargs)
            except ValueError as error:
                refused.append(Outcome(model_type, method, "refused", str(error).splitlines()[0]))
                continue
            with torch.no_grad():
                logits = model(sequence).logits
            assert torch.isfinite(logits).all(), f"{model_type} {method}: non-finite logits past L0"
            path = folder / f"{model_type}--{method}"
            model.save_pretrained(path)
            saved[path] = logits
    return refused, saved, unbuildable


def read_back(folder: Path, saved: dict[Path, torch.Tensor]) -> list[Outcome]:
    """Reload every checkpoint of :func:`patch_all`; each must give its logits (native or with the plugin)."""
    from hf_posext.commands.doctor import diagnose_path

    errors = vanilla_load_errors([(path, {"attn_implementation": "eager"}) for path in saved])
    native = [path for path, error in zip(saved, errors) if error is None]
    vanilla = vanilla_logits(native, [dict(input_ids=ids())], folder) if native else {}
    outcomes = []
    for path, logits in saved.items():
        model_type, method = path.name.split("--")
        if path in vanilla:
            assert torch.equal(vanilla[path][0], logits), f"{path.name}: vanilla transformers gives other logits"
            outcomes.append(Outcome(model_type, method, "native"))
            continue
        readers = diagnose_path(str(path))["readers"]
        verdicts = (readers["transformers5"]["verdict"], readers["transformers5_hf_posext"]["verdict"])
        assert verdicts == ("refused", "same"), f"{path.name}: vanilla refuses it but doctor says {verdicts}"
        reloaded = hf_posext.from_pretrained(path, attn_implementation="eager").eval()
        with torch.no_grad():
            again = reloaded(ids()).logits
        assert torch.equal(again, logits), f"{path.name}: hf_posext.from_pretrained gives other logits"
        outcomes.append(Outcome(model_type, method, "plugin"))
    return outcomes
