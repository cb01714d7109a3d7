"""Command-line values shared by every command: ``hf-posext patch``, ``hf-posext eval``, ``hf-posext finetune``.

A method argument is given the same way everywhere, ``--set KEY=VALUE`` (repeatable)::

    hf-posext patch base out --method yarn --factor 4 --set beta_fast=64 --set beta_slow=2
    hf-posext finetune --config run.yaml --set beta_fast=64

KEY may use ``-`` or ``_``; VALUE is read as JSON when it parses (``64``, ``0.1``, ``true``,
``[1, 2]``) and kept as a string otherwise (``mode=tail``). ``factor`` has its own flag
(``--factor``) everywhere and is refused in ``--set``.

Every command reports bad input (``ValueError``, ``OSError``: a missing or unreadable file, an
invalid ``config.json``; a missing optional package) as one line and exit code 2 (`run_command`); ``--debug``
or the environment variable ``HF_POSEXT_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import re
import sys
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .. import validation
from ..methods import method_config

#: Method arguments that have a flag of their own in every command.
OWN_FLAGS = {"factor": "--factor"}

#: Where a command writes when not given ``--out``: ``./hf_posext_out/<command>`` (one folder to find or delete).
OUTPUT_ROOT = "hf_posext_out"

#: What the commands report as bad input in one line rather than with a traceback (a missing optional
#: package included: the message names the extra to install).
USER_ERRORS = (ValueError, OSError, validation.MissingExtra)


class KeyValueError(ValueError, argparse.ArgumentTypeError):
    """A malformed ``KEY=VALUE``; an ``ArgumentTypeError`` so that argparse prints its message."""


def parse_key_value(text: str) -> tuple[str, Any]:
    """``"beta-fast=64"`` -> ``("beta_fast", 64)``.

    Raises:
        KeyValueError: no ``=`` or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise KeyValueError(f"--set expects KEY=VALUE (e.g. beta_fast=32), got {text!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return key.strip().replace("-", "_"), parsed


def parse_key_values(items: Iterable[str | tuple[str, Any]] | None) -> dict[str, Any]:
    """A mapping from ``KEY=VALUE`` strings (or pairs already parsed); later keys win."""
    pairs = (item if isinstance(item, tuple) else parse_key_value(item) for item in items or ())
    return dict(pairs)


def parse_bool(value: Any, name: str = "value") -> bool:
    """`hf_posext.validation.parse_bool` for flags: its error is an ``ArgumentTypeError`` argparse prints.

    Raises:
        KeyValueError: anything but true/false/yes/no/1/0 (any case), naming ``name`` and the spellings.
    """
    try:
        return validation.parse_bool(value, name)
    except ValueError as err:
        raise KeyValueError(str(err)) from None


def method_kwargs(items: Iterable[str | tuple[str, Any]] | None) -> dict[str, Any]:
    """`parse_key_values` for method arguments: a key with a flag of its own is refused.

    Raises:
        KeyValueError: e.g. ``factor=8`` (use ``--factor 8``).
    """
    values = parse_key_values(items)
    for key, flag in OWN_FLAGS.items():
        if key in values:
            raise KeyValueError(f"--set {key}={values[key]!r}: {key} has its own flag, use {flag} {values[key]}")
    return values


def check_factor(method: str, factor: float | None, extra: dict[str, Any] | None = None) -> None:
    """Refuse a method (aliases included) that would silently be the identity without ``--factor``.

    That is every method that scales RoPE, and Self-Extend without a ``group_size`` in ``extra``
    (``--set``'s arguments): `hf_posext.methods.base.MethodConfig.needs_factor`.

    Raises:
        ValueError: an unknown method (listing the known ones), a bad argument or a missing factor.
    """
    if factor is None and method_config(method, **(extra or {})).needs_factor():
        raise ValueError(f"--method {method} needs --factor (the context scale s, e.g. --factor 4)")


def whole(minimum: int, multiple_of: int = 1) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (and a multiple of ``multiple_of``), else a message
    argparse prints after the flag as the user wrote it (``argument --trials: ...``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum or value % multiple_of:
            extra = f" and a multiple of {multiple_of}" if multiple_of > 1 else ""
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}{extra}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    parse.checked = True  # type: ignore[attr-defined]
    return parse


def positive_number(text: str, allowed: str) -> float:
    """``text`` as a finite number > 0 (nan and inf refused), else argparse's message ``{allowed}, got {text!r}``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{allowed}, got {text!r}")
    return value


def real(low: float, high: float = float("inf")) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[low, high]`` (nan and inf refused), else argparse's message."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and low <= value <= high):
            allowed = f">= {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"expected a finite number {allowed}, got {text!r}")
        return value

    parse.__name__ = f"number >= {low:g}"
    parse.checked = True  # type: ignore[attr-defined]
    return parse


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: message``) and exit code 2, as
    every other bad input of the commands; ``--help`` still shows the usage."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def run_command(prog: str, command: Callable[[], int], debug: bool = False) -> int:
    """``command()``; bad input (`USER_ERRORS`) is printed as one line and gives exit code 2, Ctrl-C 130.

    With ``debug`` or ``HF_POSEXT_DEBUG`` set (not ``0``) the exception propagates with its traceback.
    """
    keep_traceback = debug or os.environ.get("HF_POSEXT_DEBUG", "0") not in ("", "0")
    try:
        with contextlib.nullcontext() if keep_traceback else one_line_warnings(prog):
            return command()
    except KeyboardInterrupt:  # Ctrl-C: what was saved stays saved (a fine-tune resumes with --resume)
        if keep_traceback:
            raise
        print(
            f"{prog}: interrupted; what was written before stays (a fine-tune continues with --resume)", file=sys.stderr
        )
        return 130
    except USER_ERRORS as err:
        if keep_traceback:
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """The package's own warnings as one line, ``<prog>: <Category>: <message>``, for a command's user.

    Python's format adds the file and the source line that warned (``return cls(**...)``): noise on a command
    line. Warnings from elsewhere (torch, transformers) keep that format; ``--debug`` keeps it for all.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    default = warnings.formatwarning

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int, line=None) -> str:
        if os.path.abspath(filename).startswith(package + os.sep):
            return f"{prog}: {category.__name__}: {' '.join(str(message).split())}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning  # type: ignore[assignment]
    try:
        yield
    finally:
        warnings.formatwarning = default


def take_debug(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """``(whether --debug is in argv before any "--", argv without it)``: --debug anywhere on the line."""
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    return "--debug" in argv[:end], [a for a in argv[:end] if a != "--debug"] + argv[end:]


#: Modules every command imports first (comma-separated), as ``--plugin MODULE``: a plugin registers its methods.
PLUGINS_ENV = "HF_POSEXT_PLUGINS"


def take_plugins(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(the modules of each --plugin MODULE / --plugin=MODULE before any "--", argv without them)``.

    A ``--plugin`` with no module after it is the empty name, which `load_plugins` refuses.
    """
    argv, modules, rest = list(argv), [], []
    end = argv.index("--") if "--" in argv else len(argv)
    i = 0
    while i < end:
        if argv[i] == "--plugin":
            modules.append(argv[i + 1] if i + 1 < end else "")
            i += 2
            continue
        if argv[i].startswith("--plugin="):
            modules.append(argv[i].partition("=")[2])
        else:
            rest.append(argv[i])
        i += 1
    return modules, rest + argv[end:]


def load_plugins(modules: Sequence[str]) -> int:
    """Import ``modules`` and those of `PLUGINS_ENV`, each once, in order; returns 0.

    They are written back to `PLUGINS_ENV`, so that the processes this one starts (``accelerate
    launch`` workers, a reader run in a subprocess) import them too.

    Raises:
        ValueError: naming a module that cannot be imported, or whose import raised, and why.
    """
    listed = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    names = list(dict.fromkeys([*listed, *modules]))
    for name in names:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"--plugin {name!r} (or {PLUGINS_ENV}): a module is named by dotted identifiers (pkg.mod)")
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ValueError(
                f"--plugin {name!r} (or {PLUGINS_ENV}): the module cannot be imported ({type(error).__name__}: {error})"
            ) from None
        except Exception as error:  # the plugin's own code failed (SyntaxError, RuntimeError...): still bad input
            raise ValueError(
                f"--plugin {name!r} (or {PLUGINS_ENV}): importing the module raised {type(error).__name__}: {error} "
                "(--debug shows where)"
            ) from error
    if names:
        os.environ[PLUGINS_ENV] = ",".join(names)
    return 0


def take_global_flags(prog: str, argv: Sequence[str] | None) -> tuple[int, bool, list[str]]:
    """What every entry point does first: ``--debug`` and ``--plugin`` taken from anywhere on the line
    (``sys.argv[1:]`` when ``argv`` is None) and the plugins imported.

    Returns:
        ``(exit code, debug, the rest of argv)``: the code is 0, or 2 after the one-line error of a plugin
        that cannot be imported (`load_plugins`).
    """
    debug, rest = take_debug(sys.argv[1:] if argv is None else argv)
    plugins, rest = take_plugins(rest)  # before any parser: a plugin's methods are among the choices
    return run_command(prog, lambda: load_plugins(plugins), debug=debug), debug, rest


def plain(text: str) -> str:
    """``text`` without reStructuredText markup (````code````, Sphinx roles: ``:role:`name```), for terminal help."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text).replace("``", "")


def default_out(command: str) -> str:
    """``hf_posext_out/<command>``: the output folder of ``command`` when ``--out`` is not given."""
    return f"{OUTPUT_ROOT}/{command}"


def add_set_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *aliases: str,
    dest: str = "set",
    help: str = "a method argument, e.g. beta_fast=32 (repeatable)",
) -> None:
    """Add ``--set KEY=VALUE`` (repeatable; parsed to pairs, see `parse_key_values`)."""
    parser.add_argument(
        "--set", *aliases, dest=dest, action="append", type=parse_key_value, metavar="KEY=VALUE", help=help
    )
