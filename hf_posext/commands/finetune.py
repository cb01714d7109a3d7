"""Command-line flags of the fine-tune recipe: ``transformers.HfArgumentParser`` over :class:`~.config.TrainConfig`.

Every setting is a flag (``seq_len`` -> ``--seq-len`` or ``--seq_len``) and a YAML key of
``--config``, with its help taken from the field, so the two cannot drift apart. Precedence:
flags given on the command line > the YAML file > defaults. Booleans take ``--lora`` (or
``--lora false``; true/false/yes/no/1/0 in any case, as in the YAML file) and ``--no-lora``; ``--resume`` alone means the latest training state; method
arguments go through ``--set KEY=VALUE`` (:mod:`hf_posext.commands.arguments`, as in ``hf-posext patch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

from transformers import HfArgumentParser

from .arguments import parse_bool, parse_key_value, parse_key_values
from ..train.config import TrainConfig, load_yaml


class RecipeArgumentParser(HfArgumentParser):
    """``HfArgumentParser`` plus two kinds of flag it does not build.

    * A mapping field (``method_kwargs``) becomes a repeatable ``KEY=VALUE`` flag; HfArgumentParser
      would hand the text to ``dict()``.
    * A boolean that defaults to False also gets ``--no-NAME``, so a flag can switch off what a YAML
      file switched on; HfArgumentParser adds it only to booleans that default to True.
    """

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        if typing.get_origin(field.type) is dict:
            metadata = dict(field.metadata)
            flags = [*metadata.pop("aliases", []), f"--{field.name.replace('_', '-')}"]
            parser.add_argument(*flags, dest=field.name, action="append", type=parse_key_value, metavar="KEY=VALUE",
                                **metadata)
            return
        HfArgumentParser._parse_dataclass_field(parser, field)
        if field.type is bool:
            # One spelling of booleans for flags and YAML (transformers' also takes t/y/f/n).
            parser._option_string_actions[f"--{field.name}"].type = _flag_bool(field.name)
        if field.type is bool and field.default is False:
            parser.add_argument(f"--no-{field.name.replace('_', '-')}", dest=field.name, action="store_false",
                                help=f"turn {field.name} off")


def _flag_bool(name: str):
    def parse(text: str) -> bool:
        return parse_bool(text, name)

    return parse


def _mapping_fields() -> set[str]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name for f in dataclasses.fields(TrainConfig) if typing.get_origin(hints[f.name]) is dict}


def build_parser(description: str | None = None) -> RecipeArgumentParser:
    """The recipe's argument parser: ``--config`` plus one flag per ``TrainConfig`` field."""
    parser = RecipeArgumentParser(TrainConfig, description=description)
    parser.add_argument("--config", help="a YAML file with the same keys as these flags (flags win over it)")
    return parser


def config_from_args(argv: Sequence[str] | None = None, description: str | None = None) -> TrainConfig:
    """Parse ``argv`` (and its ``--config`` file) into a validated :class:`TrainConfig`.

    Raises:
        ValueError: a bad or unknown setting (from the YAML file or the flags).
        FileNotFoundError: a ``--config`` file that does not exist.
    """
    parser = build_parser(description)
    config_file = parser.parse_known_args(argv)[0].config
    mappings = _mapping_fields()
    if config_file:
        # Not HfArgumentParser.parse_yaml_file: it builds the config from the file alone, so a
        # file without e.g. `model` would fail before the flags could fill it in, and flags could
        # not win over the file. The file's values become the parser's defaults instead.
        values = TrainConfig.check_keys(load_yaml(config_file), source=config_file)
        for name in mappings & set(values):
            # Kept as pairs, so that --set KEY=VALUE appends to them and wins key by key.
            values[name] = list(_mapping(values[name], name, config_file).items())
        parser.set_defaults(**values)
    args: dict[str, Any] = vars(parser.parse_args(argv))
    args.pop("config")
    for name in mappings:
        args[name] = parse_key_values(args[name])
    return TrainConfig.from_dict(args, source=config_file or "flags")


def _mapping(value: Any, name: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{source}: {name} must be a mapping (KEY: VALUE lines), got {value!r}")
    return value
