"""What a reader is, what it is asked about, and its answer: the one vocabulary of `hf_posext.readers`.

A reader is a program that loads a saved checkpoint (transformers 5 with and without ``import hf_posext``,
transformers 4.57, vLLM, SGLang, llama.cpp). Each is one module of this package holding a `Reader`: its name,
the version its rules were written from, whether they were run against the real program, and ``judge``, which
takes a `Subject` (a saved config as every reader sees it) and gives a `Finding`: ``same`` (runs what transformers
5 with hf-posext runs), ``misread`` (loads it and runs something else, silently), ``refused`` (a loud error), the
reader matrix's verdicts (`hf_posext.experiments.reader_matrix`), or `NO_RULE` where its rules do not cover the
config. `hf_posext.readers.registry` lists the readers; a new reader is a module with a `Reader` and one line
there. docs/readers/index.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..methods.registry import method_class
from ..rope_utils import CONFIG_KEY
from ..validation.unknown_method import unknown_method
from .rope import RopeDescription

#: A reader's verdict on a checkpoint, as the reader matrix measures it.
VERDICTS = ("same", "misread", "refused")  # refused: an error names what it cannot read; misread: silently
#: The answer of a reader whose rules do not cover a config (not a verdict: nothing was decided).
NO_RULE = "unknown"
#: Every answer a `Finding` may hold.
ANSWERS = (*VERDICTS, NO_RULE)
#: ``(verdict, how)``: a `Finding` in two words, as `hf_posext.readers.support` gives it.
Verdict = tuple[str, str]


@dataclass(frozen=True)
class Finding:
    """One reader's answer: its verdict, why in one line, the rules used, and the routes it summarises."""

    verdict: str
    why: str
    rules: str
    checked: str  # "run here" or "read from source"
    routes: dict[str, Finding] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in ANSWERS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(ANSWERS)}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict, "why": self.why, "rules": self.rules, "checked": self.checked}
        if self.routes:
            out["routes"] = {name: route.to_dict() for name, route in self.routes.items()}
        return out


@dataclass(frozen=True)
class Subject:
    """A saved config as the readers are asked about it, in one of four situations (`situation`).

    Attributes:
        config_json: config.json as a dict, as the readers that parse it themselves (transformers 4.x, llama.cpp's
            converter) see it.
        config: transformers 5's reading of it (after ``import hf_posext``); ``None`` where it has none.
        context: the context the config reaches in transformers 5 (`hf_posext.gguf.rope.reach_of`).
        damaged: the config checks that found a rope or size field damaged, contradictory or missing
            (`hf_posext.validation.config_damage.rope_damage`).
        built: for damaged configs, per ``transformers5`` and ``transformers5_hf_posext``, what transformers 5 raised
            reading the config and building its model, run (``None``: it built one with the damaged value).
        error: what ``AutoConfig`` raised reading the config (an unreadable one).
    """

    config_json: dict[str, Any]
    config: Any = None
    context: int = 0
    damaged: tuple[dict[str, str], ...] = ()
    built: dict[str, str | None] = field(default_factory=dict)
    error: str | None = None

    @property
    def situation(self) -> str:
        """``"unreadable"``, ``"damaged"``, ``"layered"`` (one rope per layer type, Gemma 3/4) or ``"rope"``."""
        if self.error is not None:
            return "unreadable"
        if self.damaged:
            return "damaged"
        return "layered" if "rope_theta" not in (self.config.rope_parameters or {}) else "rope"

    @property
    def params(self) -> dict[str, Any]:
        """transformers 5's ``rope_parameters`` (one rope, or one per layer type)."""
        return dict(self.config.rope_parameters or {})

    @property
    def rope_type(self) -> str:
        return self.params.get("rope_type", "default")

    @property
    def record(self) -> dict[str, Any]:
        """The patch record hf-posext wrote (``config.hf_posext``); ``{}`` if none, or if it is no mapping."""
        record = getattr(self.config, CONFIG_KEY, None)
        return record if isinstance(record, dict) else {}

    @property
    def method(self) -> str | None:
        """The record's method where this process has it registered (a plugin not imported: ``None``, and the
        rope alone is judged: doctor's check says so)."""
        method = self.record.get("method")
        return None if not isinstance(method, str) or unknown_method(self.record) else method

    @property
    def only_hf_posext(self) -> str | None:
        """What this checkpoint's method computes that only hf-posext does, in one line (its
        ``only_hf_posext_computes``), or ``None``: every reader but hf-posext's own then runs another model."""
        if self.situation != "rope" or self.method is None:
            return None
        return method_class(self.method).only_hf_posext_computes(self.record)

    def value_at(self, path: str) -> Any:
        """The value at a dotted config.json path (``rope_parameters.factor``), or ``None``."""
        value: Any = self.config_json
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    @property
    def fields(self) -> str:
        """The damaged fields, once each, as config.json names them (``rope_parameters.factor``)."""
        return ", ".join(dict.fromkeys(check["field"] for check in self.damaged))


@dataclass(frozen=True)
class Reader:
    """A program that reads saved checkpoints, and its rules.

    Attributes:
        key: its name in ``hf-posext doctor --json`` (``"vllm"``).
        name: its name in tables and warnings (``"vLLM"``).
        rules: the version its rules were written from, and how they were checked.
        checked: ``"run here"`` (against the real program) or ``"read from source"``.
        judge: its answer for a `Subject`.
        runs_hf_posext: whether it runs hf-posext's own code (then a definition only hf-posext computes is read
            ``same``; every other reader misreads it: `hf_posext.readers.registry.judge`).
    """

    key: str
    name: str
    rules: str
    checked: str
    judge: Callable[[Subject], Finding]
    runs_hf_posext: bool = False

    def finding(self, verdict: str, why: str, checked: str | None = None, routes: dict | None = None) -> Finding:
        """A `Finding` under this reader's rules."""
        return Finding(verdict, why, self.rules, checked or self.checked, routes or {})

    def through_transformers5(self, subject: Subject) -> Finding | None:
        """An engine that reads config.json through transformers 5 (vLLM, SGLang) on a config that is not one rope:
        refused where transformers 5 cannot read it, misread where a field is damaged, `NO_RULE` per layer type;
        ``None`` for one rope."""
        if subject.situation == "unreadable":
            why = f"reads config.json through transformers 5: AutoConfig raises {subject.error}"
            return self.finding("refused", why)
        if subject.situation == "damaged":
            why = f"config.json's {subject.fields}: it runs the value as written or fails: not the model meant"
            return self.finding("misread", why)
        if subject.situation == "layered":
            return self.one_rope_only(subject)
        return None

    def one_rope_only(self, subject: Subject) -> Finding:
        """`NO_RULE` for per-layer-type rope parameters, which rules comparing one rope do not cover."""
        keys = ", ".join(sorted(subject.params))
        return self.finding(NO_RULE, f"per-layer-type rope parameters ({keys}): these rules compare a single rope")


def _runs(description: RopeDescription, intended: RopeDescription) -> str:
    if description["kind"] == "default" and description["theta"] == intended["theta"]:
        return "plain RoPE: no scaling at any length"
    if description["kind"] == "default":
        return f"plain RoPE with one fixed base {description['theta']:.6g} at every length"
    extra = sorted(set(intended) ^ set(description))
    return f"{description['kind']} without/with {', '.join(extra)}" if extra else f"{description}"


def engine_verdict(
    rope: Callable[[], RopeDescription], intended: RopeDescription, context: int, target: int, flag: str
) -> Verdict:
    """An engine's verdict from the rope it runs (``rope()``: its ``effective_rope``, which raises ``ValueError`` for
    a rope type it does not know) and the context it defaults to (``context``; ``flag`` passes ``target``)."""
    try:
        description = rope()
    except ValueError as error:
        return "refused", f"raises {error}"
    if description != intended:
        return "misread", _runs(description, intended)
    if context != target:
        return "same", f"rope right; its default context is {context}: pass {target} ({flag} {target})"
    return "same", f"context {context}"


__all__ = ["ANSWERS", "NO_RULE", "VERDICTS", "Finding", "Reader", "Subject", "Verdict", "engine_verdict"]
