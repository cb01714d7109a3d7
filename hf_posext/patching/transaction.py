"""Undo for model surgery: a snapshot of modules' state that a failed patch restores exactly.

[`hf_posext.patch_model`][hf_posext.patch_model] takes one before it touches a model and restores it on any failure,
so a patch is all or nothing (config, submodules, parameters, buffers, hooks, attention
implementation).
"""

from __future__ import annotations

import copy
from typing import Any

import torch.nn as nn

Snapshot = list[tuple[nn.Module, dict[str, Any], list[tuple[Any, Any]]]]


def snapshot(modules: list[nn.Module]) -> Snapshot:
    """Every module's attributes and the contents of its containers (submodules, parameters, hooks).

    Containers are restored in place by `restore`, so hook handles taken before the
    snapshot keep working afterwards.
    """
    saved = []
    for module in modules:
        attributes = dict(module.__dict__)
        contents = [(value, copy.copy(value)) for value in attributes.values() if isinstance(value, (dict, set, list))]
        saved.append((module, attributes, contents))
    return saved


def restore(saved: Snapshot) -> None:
    for module, attributes, contents in saved:
        module.__dict__.clear()
        module.__dict__.update(attributes)
        for container, content in contents:
            container.clear()
            if isinstance(container, list):
                container.extend(content)
            else:
                container.update(content)
