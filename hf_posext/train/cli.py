"""Command-line flags of the fine-tune recipe, generated from :class:`~hf_posext.train.config.TrainConfig`.

Every setting is a flag (``seq_len`` -> ``--seq-len``) and a YAML key of ``--config``, so the two
can never drift apart. Precedence: flags given on the command line > the YAML file > defaults.
Booleans take ``--lora`` / ``--no-lora``; ``--resume`` alone means the latest training state;
method arguments go through ``--method-arg KEY=VALUE`` (``--method-arg beta_fast=32``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import typing
from collections.abc import Sequence
from typing import Any

from .config import TrainConfig, load_yaml


def _field_help() -> dict[str, str]:
    """First line of each setting's description in ``TrainConfig``'s docstring."""
    helps: dict[str, str] = {}
    doc = TrainConfig.__doc__ or ""
    for match in re.finditer(r"^\s{8}([a-z0-9_, ]+): (.+)$", doc, flags=re.MULTILINE):
        for name in match.group(1).split(","):
            helps[name.strip()] = match.group(2).strip()
    return helps


def _parse_method_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--method-arg expects KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except json.JSONDecodeError:
        return key.replace("-", "_"), value


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The recipe's argument parser: ``--config`` plus one flag per ``TrainConfig`` field."""
    parser = argparse.ArgumentParser(description=description, argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", help="a YAML file with the same keys as these flags")
    helps = _field_help()
    hints = typing.get_type_hints(TrainConfig)
    for item in dataclasses.fields(TrainConfig):
        flag = "--" + item.name.replace("_", "-")
        hint = hints[item.name]
        text = helps.get(item.name, "")
        default = item.default if item.default is not dataclasses.MISSING else item.default_factory()
        if default not in ("", None, [], {}):
            text += f" (default: {default})"
        if item.name == "method_kwargs":
            parser.add_argument("--method-arg", dest="method_kwargs", action="append", type=_parse_method_arg,
                                metavar="KEY=VALUE", help="a method argument, e.g. beta_fast=32 (repeatable)")
        elif item.name == "resume":
            parser.add_argument(flag, nargs="?", const="latest", metavar="PATH", help=text)
        elif hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        elif typing.get_origin(hint) is list:
            parser.add_argument(flag, nargs="+", help=text)
        else:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            base = args[0] if args else hint
            literal = typing.get_args(base) if typing.get_origin(base) is typing.Literal else ()
            if literal:
                parser.add_argument(flag, choices=literal, help=text)
            else:
                parser.add_argument(flag, type=base if base in (int, float) else str, help=text)
    return parser


def config_from_args(argv: Sequence[str] | None = None, description: str | None = None) -> TrainConfig:
    """Parse ``argv`` (and its ``--config`` file) into a validated :class:`TrainConfig`.

    Raises:
        ValueError: a bad or unknown setting (from the YAML file or the flags).
        FileNotFoundError: a ``--config`` file that does not exist.
    """
    args = vars(build_parser(description).parse_args(argv))
    values: dict[str, Any] = {}
    config_file = args.pop("config", None)
    if config_file:
        values.update({key.replace("-", "_"): value for key, value in load_yaml(config_file).items()})
    if "method_kwargs" in args:
        values["method_kwargs"] = {**values.get("method_kwargs", {}), **dict(args.pop("method_kwargs"))}
    values.update(args)
    return TrainConfig.from_dict(values, source=config_file or "flags")
