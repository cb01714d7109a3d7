"""Recipe settings that became a method's training option, still read as aliases until they go.

A method's `hf_posext.methods.training.TrainingOption` may name the recipe setting it replaced
(``old_setting``: LongRoPE's ``factors`` was ``longrope_factors``). Its flag, YAML key and
``TrainConfig`` keyword keep working with a ``FutureWarning`` (shown to a command's user, unlike a
``DeprecationWarning``) until ``REMOVED_IN``: `take_old_settings` moves the value into
``method_kwargs``, where ``--set`` puts it. Which settings these are is the registry's to say, not this module's.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ..methods import training_for
from ..methods.training import REMOVED_IN, old_training_settings
from ..method_names import registered_name


def take_old_settings(values: Mapping[str, Any], default_method: str, *, warn: bool = True) -> dict[str, Any]:
    """``values`` (``TrainConfig`` keywords) with each old setting moved into ``method_kwargs``.

    An old setting the run's method takes becomes its training option (checked against the
    option's choices); one the method does not take is dropped at the option's default (it was
    ignored then too) and refused otherwise. ``warn``: a ``FutureWarning`` naming the ``--set``
    spelling (off when reading a saved run's settings, which the user did not type).

    Raises:
        ValueError: a value the option does not take, one that disagrees with ``method_kwargs``, or one
            for a method without the option; each starting with the old setting's name.
    """
    old = old_training_settings()
    values = dict(values)
    for key in [key for key in values if key in old]:
        value = values.pop(key)
        if value is None:
            continue
        owner, option = old[key]
        if warn:
            warnings.warn(
                f"{key} is deprecated and goes in {REMOVED_IN}: it is method {owner}'s training option "
                f"{option.name}, set with --set {option.name}={value} "
                f"(YAML: method_kwargs: {{{option.name}: {value}}})",
                FutureWarning,
                stacklevel=3,
            )
        if value not in option.choices:
            raise ValueError(
                f"{key} must be one of {', '.join(option.choices)}, got {value!r} (now --set {option.name}=VALUE)"
            )
        method = values.get("method", default_method)
        try:
            takes = option in training_for(registered_name(method)).options
        except (TypeError, ValueError):  # an unknown method: its own check names it
            takes = False
        if not takes:
            if value == option.default:
                continue
            raise ValueError(
                f"{key}={value!r} is method {owner}'s training option {option.name} (--set {option.name}={value}); "
                f"method {method!r} has none: leave it out or use --method {owner}"
            )
        kwargs = values.get("method_kwargs")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            continue  # method_kwargs' own check names it
        kwargs = dict(kwargs or {})
        if kwargs.get(option.name, value) != value:
            raise ValueError(
                f"{key}={value!r} and --set {option.name}={kwargs[option.name]!r} disagree; "
                f"set it once, with --set {option.name}=..."
            )
        values["method_kwargs"] = {**kwargs, option.name: value}
    return values
