"""``hf-posext finetune``: the fine-tune recipe's command line (patch -> data -> train -> save).

    hf-posext finetune --config examples/finetune_tiny.yaml --max-train-steps 40
    accelerate launch --config_file examples/accelerate/fsdp2.yaml -m hf_posext.commands.finetune --config run.yaml

Every setting is a flag (``seq_len`` -> ``--seq-len``) and a key of the ``--config`` YAML file,
with its help taken from the `hf_posext.train.config.TrainConfig` field; flags win over
the file, the file over the defaults; the file's relative paths are read against its folder. Booleans take
``--lora``/``--lora false``/``--no-lora``; method arguments ``--set KEY=VALUE``. The guide: docs/guides/finetune.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import integration
from ..data import EXCLUDE_PREFIX, STDLIB
from ..validation import path_shape
from .arguments import parse_bool, parse_key_value, parse_key_values, run_command, take_global_flags

if TYPE_CHECKING:
    from ..train.config import TrainConfig

PROG = "hf-posext finetune"
DESCRIPTION = "Fine-tune a model for a longer context (the YaRN recipe by default): patch -> data -> train -> save."


class RecipeArgumentParser(integration.FieldArgumentParser):
    """``HfArgumentParser`` plus two kinds of flag it does not build.

    * A mapping field (``method_kwargs``) becomes a repeatable ``KEY=VALUE`` flag; HfArgumentParser
      would hand the text to ``dict()``.
    * A boolean that defaults to False also gets ``--no-NAME``, so a flag can switch off what a YAML
      file switched on; HfArgumentParser adds it only to booleans that default to True.
    """

    def error(self, message: str) -> typing.NoReturn:
        """One line and exit code 2, as every other bad input (argparse would print the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message} (--help lists the settings)\n")

    def add_field(self, parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        if typing.get_origin(field.type) is dict:
            metadata = dict(field.metadata)
            flags = [*metadata.pop("aliases", []), f"--{field.name.replace('_', '-')}"]
            parser.add_argument(
                *flags, dest=field.name, action="append", type=parse_key_value, metavar="KEY=VALUE", **metadata
            )
            return
        self.add_default_field(parser, field)
        if field.type is bool:
            # One spelling of booleans for flags and YAML (transformers' also takes t/y/f/n).
            parser._option_string_actions[f"--{field.name}"].type = _flag_bool(field.name)
        # --no-NAME's default: SUPPRESS, as the field's default comes from --NAME (added first); so the
        # help does not say "(default: True)" for a flag that turns something off
        if field.type is bool and field.default is False:
            parser.add_argument(
                f"--no-{field.name.replace('_', '-')}",
                dest=field.name,
                action="store_false",
                default=argparse.SUPPRESS,
                help=f"turn {field.name} off",
            )
        elif field.type is bool and field.default is True:  # HfArgumentParser's own --no_NAME
            negative = parser._option_string_actions[f"--no_{field.name}"]
            negative.default, negative.help = argparse.SUPPRESS, f"turn {field.name} off"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """HfArgumentParser's formatter, less "(default: None)": a None default's meaning is in the field's help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def _flag_bool(name: str):
    def parse(text: str) -> bool:
        return parse_bool(text, name)

    return parse


def _mapping_fields() -> set[str]:
    from ..train.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    return {f.name for f in dataclasses.fields(TrainConfig) if typing.get_origin(hints[f.name]) is dict}


def build_parser(description: str | None = DESCRIPTION, prog: str | None = PROG) -> RecipeArgumentParser:
    """The recipe's argument parser: ``--config`` plus one flag per ``TrainConfig`` field."""
    from ..train.settings import SETTING_GROUPS

    # One flag per TrainConfig field, listed under its group (model, method, data, ...) by --help.
    parser = RecipeArgumentParser(SETTING_GROUPS, description=description, prog=prog, formatter_class=_HelpFormatter)
    parser.add_argument("--config", help="a YAML file with the same keys as these flags (flags win over it)")
    _add_old_settings(parser)
    return parser


def _add_old_settings(parser: argparse.ArgumentParser) -> None:
    """The flags of the settings that became a method's training option (``--longrope-factors``), kept as
    aliases of ``--set NAME=VALUE`` until they go (`hf_posext.train.old_settings`)."""
    from ..methods.training import REMOVED_IN, old_training_settings

    for key, (method, option) in sorted(old_training_settings().items()):
        parser.add_argument(
            f"--{key.replace('_', '-')}",
            f"--{key}",
            dest=key,
            choices=option.choices,
            default=argparse.SUPPRESS,
            help=f"deprecated, goes in {REMOVED_IN}: --set {option.name}=VALUE (method {method}'s training option)",
        )


def config_from_args(argv: Sequence[str] | None = None, description: str | None = DESCRIPTION) -> TrainConfig:
    """Parse ``argv`` (and its ``--config`` file) into a validated `TrainConfig`.

    Raises:
        ValueError: a bad or unknown setting (from the YAML file or the flags).
        FileNotFoundError: a ``--config`` file that does not exist.
    """
    return parse_recipe_args(argv, build_parser(description))[0]


def parse_recipe_args(
    argv: Sequence[str] | None, parser: RecipeArgumentParser, defaults: dict[str, Any] | None = None
) -> tuple[TrainConfig, dict[str, Any]]:
    """``(config, other flags)``: ``argv`` parsed by ``parser`` (`build_parser` plus a command's own flags).

    ``defaults`` stand in for settings that neither the flags nor the ``--config`` file give (``hf-posext
    plan`` needs no dataset); a command's own flags come back in the second value, not in the config.

    Raises:
        ValueError: a bad or unknown setting (from the YAML file or the flags).
        FileNotFoundError: a ``--config`` file that does not exist.
    """
    from ..train.config import TrainConfig, load_yaml

    config_file = parser.parse_known_args(argv)[0].config
    mappings = _mapping_fields()
    if defaults:
        parser.set_defaults(**defaults)
    if config_file:
        # Not HfArgumentParser.parse_yaml_file: it builds the config from the file alone, so a
        # file without e.g. `model` would fail before the flags could fill it in, and flags could
        # not win over the file. The file's values become the parser's defaults instead.
        values = _relative_to(
            Path(config_file).parent, TrainConfig.read_file_values(load_yaml(config_file), source=config_file)
        )
        for name in mappings & set(values):
            # Kept as pairs, so that --set KEY=VALUE appends to them and wins key by key.
            values[name] = list(_mapping(values[name], name, config_file).items())
        parser.set_defaults(**values)
    args: dict[str, Any] = vars(parser.parse_args(argv))
    args.pop("config")
    fields = _settings()
    own = {name: args.pop(name) for name in list(args) if name not in fields}
    for name in mappings:
        args[name] = parse_key_values(args[name])
    try:
        return TrainConfig.from_dict(args, source=config_file or "flags"), own
    except ValueError as err:
        raise ValueError(_as_written(str(err), argv, config_file)) from None


def _as_written(message: str, argv: Sequence[str] | None, config_file: str | None) -> str:
    """``message`` (``"seq_len must be ..."``) prefixed with where the user wrote the setting: its flag as
    spelled (``--seq-len``), else the config file."""
    name = message.split(" ", 1)[0].rstrip(":=")
    if name not in _settings():
        return message
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    for token in reversed(list(sys.argv[1:] if argv is None else argv)):
        flag = token.split("=", 1)[0]
        if flag in spellings:
            return f"{flag}: {message}"
    return f"{config_file}: {message}" if config_file else message


def _settings() -> set[str]:
    """The names a setting goes by: `TrainConfig`'s fields and the old settings still read."""
    from ..methods.training import old_training_settings
    from ..train.config import TrainConfig

    return {f.name for f in dataclasses.fields(TrainConfig)} | set(old_training_settings())


#: Settings that are always local paths; ``model`` and ``dataset`` may also be Hub names.
_PATH_SETTINGS = ("output_dir", "checkpoint_dir", "cache_dir", "chat_template")


def _relative_to(folder: Path, values: dict[str, Any]) -> dict[str, Any]:
    """A config file's relative paths read against the file's folder, not the working directory.

    ``model`` and each ``dataset`` and ``short_dataset`` item only when they are paths: one that exists
    beside the file or cannot be a Hub name (`hf_posext.validation.path_shape`); ``stdlib`` and Hub names stay.
    """

    def local(item: Any, always: bool = False) -> Any:
        if not isinstance(item, str) or not item or os.path.isabs(os.path.expanduser(item)) or item.startswith("~"):
            return item
        beside = os.path.normpath(folder / item)
        if always or os.path.exists(beside) or path_shape(item) is not None or any(c in item for c in "*?["):
            return beside
        return item

    values = dict(values)
    for name in _PATH_SETTINGS:
        if name in values:
            values[name] = local(values[name], always=True)
    if "model" in values:
        values["model"] = local(values["model"])
    if isinstance(values.get("resume"), str) and values["resume"] != "latest":
        values["resume"] = local(values["resume"], always=True)

    def dataset_item(item: Any) -> Any:
        if item == STDLIB:
            return item
        if isinstance(item, str) and item.startswith(EXCLUDE_PREFIX):
            # An exclusion is a glob over absolute paths: a leading * matches anywhere and stays as it is.
            pattern = item[len(EXCLUDE_PREFIX) :]
            return item if pattern.startswith("*") else EXCLUDE_PREFIX + str(local(pattern, always=True))
        return local(item)

    for name in ("dataset", "short_dataset"):
        if name in values:
            items = values[name]
            resolved = [dataset_item(item) for item in ([items] if isinstance(items, str) else items)]
            values[name] = resolved[0] if isinstance(items, str) else resolved
    return values


def _mapping(value: Any, name: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{source}: {name} must be a mapping (KEY: VALUE lines), got {value!r}")
    return value


def summary(result: Any) -> str:
    """What a finished run prints: where it went and, with ``eval_blocks``, perplexity before and after."""
    lines = [f"wrote {result.output_dir} ({result.steps} steps, final loss {result.final_loss:.4f})"]
    if result.eval:
        lines += [
            "",
            "held-out perplexity (eval_blocks)",
            "| before | after |",
            "|---:|---:|",
            "| " + " | ".join(f"{result.eval[k]:.4f}" if k in result.eval else "-" for k in ("before", "after")) + " |",
        ]
    return "\n".join(lines)


def _run(argv: Sequence[str] | None) -> int:
    from accelerate import PartialState

    from ..train.loop import train  # the heavy part (accelerate, peft), once the flags parsed
    from .memory_check import check_fits

    config, own = parse_recipe_args(argv, finetune_parser())
    check_fits(config, own["memory"], own["force"])  # before the model loads
    result = train(config)
    if PartialState().is_main_process:
        print(summary(result))
    return 0


def finetune_parser() -> RecipeArgumentParser:
    """`build_parser` plus the flags of the memory check (``--memory``, ``--force``), which are no settings."""
    from .memory_check import add_layout_arguments

    parser = build_parser()
    add_layout_arguments(parser, launched=True)
    parser.add_argument(
        "--force", action="store_true", help="run even when the memory plan says the run does not fit (a warning)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``hf-posext finetune ARGS`` and ``python -m hf_posext.commands.finetune ARGS`` (for ``accelerate launch -m``)."""
    code, debug, rest = take_global_flags(PROG, argv)  # each accelerate worker imports the plugins too
    return code or run_command(PROG, lambda: _run(rest), debug=debug)


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext finetune``: the rest of the line goes to the recipe parser (`build_parser`)."""
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune a model for a longer context (YaRN recipe); --help lists the settings",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument("recipe_args", nargs="*")
    p.set_defaults(func=lambda args: _run(args.recipe_args))


if __name__ == "__main__":
    sys.exit(main())
