"""What fine-tuning needs from a method beyond its config: its training options and hooks (`Training`).

A family registers a `Training` with its method (``register_method(..., training=...)``) when the
recipe must do something for it: a training option the user sets with ``--set`` (LongRoPE's
``factors``), a check of the run's lengths, a state every forward of a micro-batch is pinned to
(LongRoPE's factor set), lines of the model card. The recipe (`hf_posext.train`) asks the registered
`Training` and never compares method names; a method without one gets `NO_TRAINING` (nothing to do).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch.nn as nn

from ..method_names import METHODS, available_methods, registered_name
from ..post_import import REMOVED_IN as REMOVED_IN  # the release that stops reading old_setting


@dataclass(frozen=True)
class TrainingOption:
    """One training option of a method: a ``--set NAME=VALUE`` key of ``hf-posext finetune`` (``method_kwargs``).

    Attributes:
        name: the key (lower-case); no field of the method's config has it.
        choices: the values it takes.
        default: the value when it is not set (one of ``choices``).
        help: what it does, for the guide and ``--help``.
        old_setting: the recipe setting it replaced (``longrope_factors``), still read as an alias
            (flag ``--longrope-factors``, YAML key, ``TrainConfig`` keyword) with a ``FutureWarning``,
            until ``hf_posext.post_import.REMOVED_IN`` (0.3.0); ``None``: none.
    """

    name: str
    choices: tuple[str, ...]
    default: str
    help: str = ""
    old_setting: str | None = None

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.lower() or not self.name.isidentifier():
            raise ValueError(f"a training option's name is a lower-case identifier, got {self.name!r}")
        if self.default not in self.choices:
            raise ValueError(f"training option {self.name!r}: default {self.default!r} is not one of {self.choices}")

    def check(self, method: str, value: Any) -> str:
        """``value`` if it is one of `choices`.

        Raises:
            ValueError: naming the method, the option, the value and the choices.
        """
        if not isinstance(value, str) or value not in self.choices:
            raise ValueError(
                f"--set {self.name}={value!r}: method {method}'s training option {self.name} is one of "
                f"{', '.join(self.choices)}"
            )
        return value


class Training:
    """What fine-tuning needs from one method; every hook does nothing by default.

    A family passes an instance (or the class) to [`register_method`][hf_posext.register_method]
    (``training=``). The recipe resolves `options` from ``--set`` (`resolve`), then calls
    `check_lengths` once the run's lengths are known, `pin_for` for each micro-batch, `pinned`
    around each micro-batch's forward and backward, and `describe` for the model card.
    """

    #: The method's training options (``--set`` keys the recipe keeps, not passed to the method's config).
    options: ClassVar[tuple[TrainingOption, ...]] = ()

    def resolve(self, method: str, given: Mapping[str, Any]) -> dict[str, str]:
        """Every option of `options`: its value in ``given`` (checked), else its default.

        Raises:
            ValueError: a value an option does not take (`TrainingOption.check`).
        """
        return {
            option.name: option.check(method, given[option.name]) if option.name in given else option.default
            for option in self.options
        }

    def check_lengths(self, options: Mapping[str, str], *, original_context: int, short_len: int | None) -> None:
        """Refuse, with a ``ValueError`` naming the setting, lengths of a run the method cannot train.

        Args:
            options: `resolve`'s.
            original_context: the patched model's original context (L_orig).
            short_len: tokens of a short micro-batch (the long/short mix), ``None`` without short ones.
        """

    def pin_for(self, options: Mapping[str, str], *, length: int, original_context: int) -> Hashable | None:
        """What every forward of a micro-batch standing for a sequence of ``length`` tokens is pinned to.

        A PoSE sample stands for the trained sequence, whatever its largest position; ``None`` (the
        default): nothing is pinned. The value is a function of its arguments alone: every process
        and a resumed run get the same.
        """
        return None

    def pinned(self, model: nn.Module, pin: Hashable) -> contextlib.AbstractContextManager[Any]:
        """The block a micro-batch's forward and backward run in, pinned to ``pin`` (from `pin_for`, not ``None``).

        ``model`` may be wrapped (PEFT, DDP...). Default: nothing is done.
        """
        return contextlib.nullcontext()

    def describe(self, options: Mapping[str, str]) -> dict[str, str]:
        """Lines of the fine-tuned model's card (``{"what": "how it was trained"}``); default none."""
        return {}


#: The training of a method that needs nothing of the recipe.
NO_TRAINING = Training()


#: ``{config class: its Training}``, filled by `hf_posext.methods.registry.register_family` (all or nothing).
TRAININGS: dict[type, Training] = {}


def training_for(method: str | Any) -> Training:
    """What fine-tuning needs of ``method`` (a name, alias, config or config class): the `Training` registered
    for its class or its nearest base class, `NO_TRAINING` if none.

    Raises:
        ValueError: for an unknown method name, listing the known ones.
    """
    if isinstance(method, str):
        method = METHODS[registered_name(method)]
    cls = method if isinstance(method, type) else type(method)
    for base in cls.__mro__:
        if base in TRAININGS:
            return TRAININGS[base]
    return NO_TRAINING


def _training_options() -> list[tuple[TrainingOption, str]]:
    """``(option, method name)`` of every registered method's training options."""
    return [(option, name) for name in available_methods() for option in training_for(name).options]


def old_training_settings() -> dict[str, tuple[str, TrainingOption]]:
    """``{old recipe setting: (method name, the training option that replaced it)}`` (``longrope_factors``...)."""
    return {option.old_setting: (name, option) for option, name in _training_options() if option.old_setting}


def split_method_kwargs(method: str, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--set``'s ``kwargs`` for ``method`` as ``(its config's arguments, its training options)``.

    The training options are `Training.resolve`'s: every option of the method, checked, defaults filled in.

    Raises:
        ValueError: an unknown method, or a value a training option does not take.
    """
    training = training_for(method)
    names = {option.name for option in training.options}
    arguments = {key: value for key, value in kwargs.items() if key not in names}
    return arguments, training.resolve(registered_name(method), kwargs)


def built_trainings(specs: Sequence[tuple[str, type, Training | type[Training] | None]]) -> dict[type, Training]:
    """Each ``(method name, config class, training)``'s `Training` built and checked, before anything is kept.

    Raises:
        ValueError: a training that is no `Training`, an option that clashes with the method's arguments,
            or an old setting another method's option already reads.
    """
    trainings = {cls: training() if isinstance(training, type) else training for _, cls, training in specs if training}
    taken = {option.old_setting: option for option, _ in _training_options()}
    for name, cls, _ in specs:
        if cls not in trainings:
            continue
        check_training(name, trainings[cls], cls)
        for option in trainings[cls].options:
            if option.old_setting is not None and taken.setdefault(option.old_setting, option) is not option:
                raise ValueError(f"{name}: the old setting {option.old_setting!r} is already another option's")
    return trainings


def check_training(method: str, training: Training, config_cls: type) -> None:
    """Refuse a `Training` whose options are no `TrainingOption` or clash with ``config_cls``'s arguments.

    Raises:
        ValueError: naming the method and the option.
    """
    if not isinstance(training, Training):
        raise ValueError(f"{method}: training must be a Training (or its class), got {training!r}")
    arguments = {f.name for f in dataclasses.fields(config_cls)}
    names = []
    for option in training.options:
        if not isinstance(option, TrainingOption):
            raise ValueError(f"{method}: training options are TrainingOption, got {option!r}")
        if option.name in arguments:
            raise ValueError(
                f"{method}: training option {option.name!r} is also an argument of {config_cls.__name__}; "
                "--set could not tell them apart"
            )
        names.append(option.name)
    if len(set(names)) < len(names):
        raise ValueError(f"{method}: training option names repeat: {names}")
