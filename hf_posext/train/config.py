"""The fine-tune recipe's settings as one object: `TrainConfig`, filled from defaults, a YAML file and flags.

Its fields are the eight groups of `hf_posext.train.settings` (model, method, data, schedule, optimisation,
distribution, checkpointing, evaluation), each field with its help and its check; every value is checked
once, when a `TrainConfig` is built, before a model or dataset is touched (docs/notes/training.md).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ..methods.training import old_training_settings
from ..validation import Check, parse_bool
from .old_settings import take_old_settings
from .settings import (
    CHECKS,
    DEFAULT_FACTOR,
    SETTING_GROUPS,
    CheckpointSettings,
    DataSettings,
    DistributionSettings,
    EvaluationSettings,
    MethodSettings,
    ModelSettings,
    OptimisationSettings,
    ScheduleSettings,
    build_scheduler,
)

__all__ = ["DEFAULT_FACTOR", "FIELD_CHECKS", "TrainConfig", "build_scheduler", "load_yaml"]

G = TypeVar("G")

#: Field types read from text by their flag's parser; a YAML string value is read the same way.
_NUMBER_TYPES: dict[Any, type] = {int: int, float: float, int | None: int, float | None: float}


def _reads_old_settings(cls: type) -> type:
    """``cls`` (a dataclass) whose constructor also takes the old settings of `old_settings` (warned, moved)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        default_method = cls.__dataclass_fields__["method"].default  # type: ignore[attr-defined]
        init(self, *args, **take_old_settings(kwargs, default_method))

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


# Bases in reverse: a dataclass takes its bases' fields from the last base to the first, so the fields
# (and the keyword arguments) come in SETTING_GROUPS' order, model first.
@_reads_old_settings
@dataclass
class TrainConfig(
    EvaluationSettings,
    CheckpointSettings,
    DistributionSettings,
    OptimisationSettings,
    ScheduleSettings,
    DataSettings,
    MethodSettings,
    ModelSettings,
):
    """Everything one fine-tune run needs: the settings of every group of `hf_posext.train.settings`.

    The recipe reads them by name (``config.seq_len``); `group` gives one group's settings alone. Each
    field's ``help`` is its documentation: ``hf-posext finetune --help`` prints it (through
    ``transformers.HfArgumentParser``, `hf_posext.commands.finetune`), so code and flags cannot drift apart.
    """

    # HfArgumentParser(TrainConfig) lists every flag in one section, not under the first base's group name.
    _argument_group_name = "settings"

    def __post_init__(self) -> None:
        self._read_text_values()
        if isinstance(self.dataset, (str, os.PathLike)):
            self.dataset = [str(self.dataset)]
        self.dataset = [str(item) for item in self.dataset]
        if isinstance(self.short_dataset, (str, os.PathLike)):
            self.short_dataset = [str(self.short_dataset)]
        self.short_dataset = [str(item) for item in self.short_dataset]
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [name.strip() for name in self.lora_target_modules.split(",") if name.strip()]
        if self.resume is True:
            self.resume = "latest"
        elif self.resume is False:
            self.resume = None
        self.validate()

    def _read_text_values(self) -> None:
        """Booleans and numbers given as text (YAML ``lora: "false"``, ``factor: "4"``) are read as the flags read them.

        A boolean is true/false/yes/no/1/0 in any case and nothing else (``"false"`` is not true
        because it is a non-empty string); a number in quotes is that number, as on the command line.
        """
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            setattr(self, field.name, _read_text(field.name, hints[field.name], getattr(self, field.name)))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad setting and what is allowed.

        Each field's check (`FIELD_CHECKS`) runs in field order; then each group's ``check_together``,
        what no single field can check alone (a warm-up longer than the run, the method's own arguments...).
        """
        for field in dataclasses.fields(self):
            setattr(self, field.name, FIELD_CHECKS[field.name](field.name, getattr(self, field.name)))
        self.check_together()

    def check_together(self) -> None:
        """Every group's ``check_together``, in `SETTING_GROUPS`' order."""
        for group in SETTING_GROUPS:
            if "check_together" in vars(group):
                vars(group)["check_together"](self)

    def group(self, group: type[G]) -> G:
        """This run's settings of one group (``config.group(ScheduleSettings)``), as that group's dataclass."""
        if group not in SETTING_GROUPS:
            raise ValueError(
                f"{group!r} is not a settings group; the groups are {[g.__name__ for g in SETTING_GROUPS]}"
            )
        return group(**{field.name: getattr(self, field.name) for field in dataclasses.fields(group)})

    @property
    def checkpoint_path(self) -> Path:
        """The folder training states are saved to and resumed from."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(f"{self.output_dir}-checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def check_keys(cls, values: dict[str, Any], source: str = "config") -> dict[str, Any]:
        """``values`` with ``-`` in keys read as ``_``.

        Raises:
            ValueError: for a key that is no setting, listing the settings.
        """
        known = {f.name for f in dataclasses.fields(cls)} | set(old_training_settings())
        normalized = {str(key).replace("-", "_"): value for key, value in values.items()}
        unknown = sorted(set(normalized) - known)
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {unknown}; the settings are: {', '.join(sorted(known))}")
        return normalized

    @classmethod
    def read_file_values(cls, values: dict[str, Any], source: str) -> dict[str, Any]:
        """``values`` of a config file with their keys checked and text read as the flags read it
        (``lora: "false"``, ``factor: "4"``); their values are checked once, with the flags', when the
        `TrainConfig` is built (`hf_posext.commands.finetune` names the file in that error).

        Raises:
            ValueError: ``"<source>: ..."``: an unknown key, or a boolean or number that text cannot be.
        """
        hints = typing.get_type_hints(cls)
        old = old_training_settings()
        read = {}
        for name, value in cls.check_keys(values, source).items():
            try:  # an old setting is read with the method, which the flags may still set (`take_old_settings`)
                read[name] = value if name in old else _read_text(name, hints[name], value)
            except ValueError as err:
                raise ValueError(f"{source}: {err}") from None
        return read

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build a config from ``values`` whose keys may use ``-`` or ``_``.

        Raises:
            ValueError: for a key that is no setting, listing the settings, or a bad value.
        """
        return cls(**cls.check_keys(values, source))


def _read_text(name: str, hint: Any, value: Any) -> Any:
    """A boolean or number given as text read as its flag reads it (see ``TrainConfig._read_text_values``)."""
    if hint is bool:
        return parse_bool(value, name)
    if isinstance(value, str) and hint in _NUMBER_TYPES:
        kind = _NUMBER_TYPES[hint]
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{name} must be a number ({kind.__name__}), got {value!r}") from None
    return value


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML config file (keys as in the flags).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not valid YAML (naming the line and column) or does not hold a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:  # a bad indentation: one line naming the place, not the parser's traceback
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path}:{where} not valid YAML ({problem})") from err
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(values).__name__}")
    return values


#: Each `TrainConfig` field's check, in field order: `hf_posext.train.settings.CHECKS` (the groups' order is
#: the fields' order), under the name the recipe and its tests use.
FIELD_CHECKS: dict[str, Check] = CHECKS
