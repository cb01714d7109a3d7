"""LongRoPE's evolutionary search of per-pair long factors, on any model hf-posext patches, on CPU or GPU.

Ding et al. 2024, arXiv:2402.13753 sec. 3.2 (microsoft/LongRoPE ``evolution/``): a population
started from YaRN's factors and mutations of them; each round keeps the best half and adds
mutants and crossovers, non-decreasing, never a repeat; fitness = perplexity at the target length
(transformers' ``longrope`` full forward: every position with the long factors), of every token or
the last ``score_last`` of each window. The start is YaRN exactly past L_orig: its factors and its
attention factor 0.1 ln s + 1. ``keep_first=n`` scores every candidate with its first n positions on
plain RoPE (the paper's n-hat, fixed for the search). Resumable: the state is written atomically
after every round. Algorithm, defaults and measured results: docs/methods/longrope.md.
Longer than ~400 lines: the population (`_Search`), its state file and the search's checks are one
unit, used by `search_longrope` alone; apart, each would be a module of one caller.

    result = hf_posext.search_longrope(model, ids, factor=8, length=1024, population=16, rounds=8)
    hf_posext.patch_model(model, "longrope", factor=8, long_factor=result.long_factor,
                          attention_factor=result.attention_factor)
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from tqdm.auto import tqdm
from transformers.utils import logging as transformers_logging

from .patching.shipped_rope import base_rope
from .eval.perplexity import sequence_nll
from .files import write_text
from .methods import method_config
from .methods.base import BaseRope
from .methods.longrope import yarn_long_factors
from .patching import patch_model, patched_method, unpatch_model
from .rope_utils import yarn_mscale
from .validation import real_number, whole_number

#: Version of the state file's layout (a state of another version is refused, not misread).
STATE_VERSION = 1


@dataclass
class LongRopeSearchResult:
    """What [`search_longrope`][hf_posext.search_longrope] found.

    Attributes:
        long_factor: the best factors found, one per rotary pair, non-decreasing.
        perplexity: their perplexity at ``length`` (never above ``start_perplexity``).
        start_perplexity: the perplexity of the starting factors (YaRN's ramp unless given).
        history: one entry per round: ``{"round", "best_perplexity", "evaluated"}`` (candidates
            evaluated so far, the starting population included).
        attention_factor: the cos/sin multiplier every candidate was scored with (pass it to
            ``patch_model`` with the factors; default YaRN's 0.1 ln s + 1).
        score_last: the tokens scored at the end of each window (``length - 1``: all of them).
        keep_first: the positions every candidate kept on plain RoPE (pass it to ``patch_model`` too; 0: none).
        factor, length, original_max_position_embeddings: what was searched for.
    """

    long_factor: list[float]
    perplexity: float
    start_perplexity: float
    history: list[dict[str, Any]] = field(default_factory=list)
    factor: float = 1.0
    length: int = 0
    original_max_position_embeddings: int = 0
    attention_factor: float = 1.0
    score_last: int = 0
    keep_first: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Search:
    """The population, every candidate evaluated so far, and the random state: what a state file holds."""

    def __init__(
        self,
        model: nn.Module,
        documents: torch.Tensor,
        factor: float,
        length: int,
        step: float,
        rng: random.Random,
        attention_factor: float,
        score_last: int,
        keep_first: int,
    ) -> None:
        self.model, self.documents, self.factor, self.length, self.step, self.rng = (
            model,
            documents,
            factor,
            length,
            step,
            rng,
        )
        self.attention_factor, self.score_last, self.keep_first = attention_factor, score_last, keep_first
        self.evaluated: dict[tuple[float, ...], float] = {}
        self.population: list[tuple[float, ...]] = []

    def key(self, factors: list[float]) -> tuple[float, ...]:
        return tuple(round(f, 6) for f in factors)

    def perplexity(self, factors: tuple[float, ...]) -> float:
        """Perplexity of the last ``score_last`` tokens of ``documents[:, :length]`` with these long factors
        (memoised: repeats are never re-run)."""
        if factors in self.evaluated:
            return self.evaluated[factors]
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # its note on the mscale keys vLLM reads, once per candidate
        try:
            patch_model(
                self.model,
                "longrope",
                factor=self.factor,
                long_factor=list(factors),
                attention_factor=self.attention_factor,
                keep_first=self.keep_first,
                exact_cache=False,
                override=True,
            )
        finally:
            transformers_logging.set_verbosity(verbosity)
        with torch.inference_mode():
            device = next(self.model.parameters()).device
            nll = sum(
                float(sequence_nll(self.model, row[None, : self.length].to(device), self.score_last))
                for row in self.documents
            )
        value = math.exp(nll / (len(self.documents) * self.score_last))
        self.evaluated[factors] = value
        return value

    def grid(self, low: float, high: float) -> list[float]:
        """The values ``low, low + step, ...`` up to ``high`` (LongRoPE's search space), ends included."""
        count = int(math.floor((high - low) / self.step + 1e-9))
        return [round(low + k * self.step, 6) for k in range(count + 1)] + (
            [high] if high - low > count * self.step + 1e-9 else []
        )

    def mutate(self, parent: tuple[float, ...], tries: int = 100) -> tuple[float, ...] | None:
        """Each factor, with probability 0.3, resampled on the grid between its neighbours (the first
        from 1, the last up to ``factor``): non-decreasing by construction; ``None`` if only repeats came."""
        for _ in range(tries):
            child = list(parent)
            for i in range(len(child)):
                if self.rng.random() < 0.3:
                    low = child[i - 1] if i > 0 else 1.0
                    high = child[i + 1] if i + 1 < len(child) else max(self.factor, child[i])
                    child[i] = self.rng.choice(self.grid(low, max(low, high)))
            key = self.key(child)
            if key not in self.evaluated and key != parent:
                return key
        return None

    def crossover(
        self, first: tuple[float, ...], second: tuple[float, ...], tries: int = 100
    ) -> tuple[float, ...] | None:
        """Each factor from either parent with equal chance; kept if non-decreasing and new."""
        if first == second:
            return None
        for _ in range(tries):
            child = [b if self.rng.random() < 0.5 else a for a, b in zip(first, second, strict=True)]
            key = self.key(child)
            if all(x <= y for x, y in zip(key, key[1:])) and key not in self.evaluated:
                return key
        return None

    def best(self) -> tuple[tuple[float, ...], float]:
        factors = min(self.evaluated, key=lambda k: self.evaluated[k])
        return factors, self.evaluated[factors]

    def seed(self, start: tuple[float, ...], population: int) -> None:
        """The starting population: ``start`` and distinct mutants of it, up to ``population`` (fewer if
        only repeats come); none of them evaluated yet."""
        self.population = [start]
        while len(self.population) < population:
            child = self.mutate(start)
            if child is None:
                break
            self.population.append(child)
            self.evaluated[child] = float("nan")  # reserved: no duplicate while filling
        for key in [k for k, v in self.evaluated.items() if math.isnan(v)]:
            del self.evaluated[key]

    def next_generation(self, population: int) -> None:
        """One round: the best half of the population are kept as parents, then mutants and crossovers of
        them, each evaluated, fill it up to ``population`` (fewer if only repeats come)."""
        parents = sorted(self.population, key=lambda k: self.evaluated[k])[: max(1, population // 2)]
        children: list[tuple[float, ...]] = []
        mutations = math.ceil((population - len(parents)) / 2)
        while len(parents) + len(children) < population:
            child = None
            if len(children) >= mutations and len(parents) > 1:
                one, two = sorted(self.rng.sample(range(len(parents)), 2))
                child = self.crossover(parents[one], parents[two])
            if child is None:
                child = self.mutate(parents[self.rng.randrange(len(parents))])
            if child is None:
                break
            self.perplexity(child)
            children.append(child)
        self.population = parents + children

    def state(self, fingerprint: str, round_index: int, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The state file's content after ``round_index`` rounds (JSON-ready)."""
        rng = self.rng.getstate()
        return {
            "version": STATE_VERSION,
            "fingerprint": fingerprint,
            "round": round_index,
            "rng": [rng[0], list(rng[1]), rng[2]],
            "history": history,
            "population": [list(k) for k in self.population],
            "evaluated": [[list(k), v] for k, v in self.evaluated.items()],
        }

    def restore(self, saved: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
        """Take the population, evaluations and random state of a state file's content (`state`);
        returns its history and how many rounds it had run."""
        self.evaluated = {tuple(f): p for f, p in saved["evaluated"]}
        self.population = [tuple(f) for f in saved["population"]]
        self.rng.setstate((saved["rng"][0], tuple(saved["rng"][1]), saved["rng"][2]))
        return saved["history"], saved["round"]


def _fingerprint(model: nn.Module, documents: torch.Tensor, settings: dict[str, Any]) -> str:
    """What a state file must match to be resumed: the text, the model's weights' shapes and sums, the settings."""
    digest = hashlib.sha256(documents.cpu().numpy().tobytes())
    with torch.no_grad():
        for name, param in sorted(model.state_dict().items()):
            digest.update(f"{name}{tuple(param.shape)}{float(param.double().sum()):.10e}".encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


def _check(
    model: nn.Module,
    input_ids: torch.Tensor,
    factor: Any,
    length: Any,
    population: Any,
    rounds: Any,
    step: Any,
    original: int,
    score_last: Any,
    attention_factor: Any,
    keep_first: Any,
) -> tuple[torch.Tensor, float, int, int, int, float, int, float, int]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() not in (1, 2) or input_ids.is_floating_point():
        raise ValueError(f"input_ids must be an integer tensor [seq] or [documents, seq], got {input_ids!r:.80}")
    documents = input_ids if input_ids.dim() == 2 else input_ids[None]
    factor = real_number("search_longrope", "factor", factor, ">= 1")
    if factor < 1:
        raise ValueError(f"search_longrope: factor must be >= 1, got {factor!r}")
    length = whole_number("search_longrope", "length", length, minimum=2, allowed="an int")
    if length <= original:
        raise ValueError(
            f"search_longrope: length must be above the original context {original} (the long factors "
            f"are used past it), got {length}"
        )
    if length > documents.shape[1]:
        raise ValueError(f"search_longrope: length {length} is beyond the text ({documents.shape[1]} tokens)")
    population = whole_number("search_longrope", "population", population, minimum=2, allowed="an int >= 2")
    rounds = whole_number("search_longrope", "rounds", rounds, minimum=0, allowed="an int >= 0")
    step = real_number("search_longrope", "step", step, "> 0")
    if step <= 0:
        raise ValueError(f"search_longrope: step must be > 0, got {step!r}")
    if score_last is None:
        score_last = length - 1
    if isinstance(score_last, bool) or not isinstance(score_last, int) or not 1 <= score_last <= length - 1:
        raise ValueError(
            f"search_longrope: score_last must be an int in [1, {length - 1}] (tokens scored at the end "
            f"of each {length}-token window) or None, got {score_last!r}"
        )
    if attention_factor is None:
        attention_factor = yarn_mscale(factor)
    attention_factor = real_number("search_longrope", "attention_factor", attention_factor, "> 0 or None")
    if not (attention_factor > 0 and math.isfinite(attention_factor)):
        raise ValueError(
            f"search_longrope: attention_factor must be a positive number or None, got {attention_factor!r}"
        )
    kept = (
        f"an int in [0, {original - 1}] (the first positions kept on plain RoPE lie within the original context "
        f"{original}, below length {length})"
    )
    keep_first = whole_number("search_longrope", "keep_first", keep_first, minimum=0, allowed=kept)
    if keep_first >= original:
        raise ValueError(f"search_longrope: keep_first must be {kept}, got {keep_first!r}")
    return documents, factor, length, population, rounds, step, score_last, attention_factor, keep_first


def search_longrope(
    model: nn.Module,
    input_ids: torch.Tensor,
    factor: float,
    length: int,
    population: int = 64,
    rounds: int = 40,
    seed: int = 0,
    *,
    start: list[float] | None = None,
    attention_factor: float | None = None,
    score_last: int | None = None,
    keep_first: int = 0,
    step: float = 0.01,
    state_path: str | Path | None = None,
    progress: bool = True,
) -> LongRopeSearchResult:
    """LongRoPE's evolutionary search of the long factors at scale ``factor`` (see module docs).

    Args:
        model: a causal LM hf-posext can patch (plain RoPE, or a shipped scaling, searched over
            plain RoPE's frequencies); left as it was on return.
        input_ids: ``[seq]`` or ``[documents, seq]`` token ids; each document's first ``length``
            tokens are scored.
        factor: the context scale s >= 1; factors lie between 1 and s.
        length: the target length, above the original context L_orig and at most ``seq``.
        population: candidates per round (>= 2); the best half are kept as parents.
        rounds: evolution rounds after the starting population.
        seed: the random seed (a seed gives the same search).
        start: the factors to start from (default: YaRN's ramp, `hf_posext.methods.longrope.yarn_long_factors`).
        attention_factor: the cos/sin multiplier of every candidate (default YaRN's 0.1 ln s + 1, so that
            the start is YaRN exactly past L_orig; LongRoPE's sqrt(1 + ln s / ln L_orig) is another choice).
        score_last: score the last n tokens of each window (default ``None``: all ``length - 1``, the
            paper's perplexity at the target length; a smaller n weighs only the far positions).
        keep_first: every candidate keeps positions ``0 .. keep_first - 1`` on plain RoPE (the paper's n-hat,
            here fixed); 0 (default): none, transformers' ``longrope``. Above 0 the result needs
            ``patch_model(..., keep_first=keep_first)``, a checkpoint only hf-posext reads.
        step: the grid mutations sample on (LongRoPE: 0.01).
        state_path: a JSON file the state is written to after every round; a run finding a state of the
            same search there resumes from it.
        progress: show a tqdm bar with the best perplexity.

    Raises:
        ValueError: a bad value, named; a state file of another search.
    """
    previous = patched_method(model)
    if previous is not None:
        raise ValueError(
            f"search_longrope needs an unpatched model; this one is patched with {previous.name!r} "
            "(hf_posext.unpatch_model first)"
        )
    base = base_rope(model.config, method_config("longrope"), override=True)
    original = base.original_max_position_embeddings
    documents, factor, length, population, rounds, step, score_last, attention_factor, keep_first = _check(
        model, input_ids, factor, length, population, rounds, step, original, score_last, attention_factor, keep_first
    )
    first = _start_factors(base, original, factor, start)
    settings = {
        "factor": factor,
        "length": length,
        "population": population,
        "seed": seed,
        "step": step,
        "start": [float(f) for f in first],
        "attention_factor": attention_factor,
        "score_last": score_last,
    }
    if keep_first:  # absent at 0, so that states written before the option still resume
        settings["keep_first"] = keep_first
    fingerprint = _fingerprint(model, documents[:, :length], settings)
    search = _Search(
        model, documents, factor, length, step, random.Random(seed), attention_factor, score_last, keep_first
    )
    history: list[dict[str, Any]] = []
    done = 0
    state = Path(state_path) if state_path is not None else None
    try:
        start_key = search.key(list(first))
        if state is not None and state.exists():
            history, done = search.restore(_read_state(state, fingerprint))
        else:
            search.seed(start_key, population)
        start_perplexity = search.perplexity(start_key)
        bar = tqdm(total=rounds, initial=min(done, rounds), desc="longrope search", disable=not progress)
        for candidate in search.population:
            search.perplexity(candidate)
        for round_index in range(done, rounds):
            search.next_generation(population)
            best_factors, best = search.best()
            history.append({"round": round_index + 1, "best_perplexity": best, "evaluated": len(search.evaluated)})
            if state is not None:
                write_text(state, json.dumps(search.state(fingerprint, round_index + 1, history)))
            bar.update(1)
            bar.set_postfix(best_ppl=f"{best:.4g}")
        bar.close()
        best_factors, best = search.best()
    finally:
        if patched_method(model) is not None:
            unpatch_model(model)
    return LongRopeSearchResult(
        long_factor=[float(f) for f in best_factors],
        perplexity=best,
        start_perplexity=start_perplexity,
        history=history,
        factor=factor,
        length=length,
        original_max_position_embeddings=original,
        attention_factor=attention_factor,
        score_last=score_last,
        keep_first=keep_first,
    )


def _start_factors(base: BaseRope, original: int, factor: float, start: list[float] | None) -> list[float]:
    """The factors the search starts from: ``start`` (checked as LongRoPE's ``long_factor``, one per rotary
    pair of ``base``, the model's plain rope), by default YaRN's ramp at scale ``factor``."""
    pairs = base.rotary_dim // 2
    first = start if start is not None else yarn_long_factors(base.theta, base.rotary_dim, original, factor)
    method_config("longrope", factor=factor, long_factor=first)  # validates start
    if len(first) != pairs:
        raise ValueError(f"search_longrope: start has {len(first)} factors; the model has {pairs} rotary pairs")
    return first


def _read_state(state: Path, fingerprint: str) -> dict[str, Any]:
    """The content of the state file ``state``, refused unless it was written by this same search."""
    saved = json.loads(state.read_text())
    if saved.get("version") != STATE_VERSION or saved.get("fingerprint") != fingerprint:
        raise ValueError(
            f"search_longrope: {str(state)!r} holds the state of another search (other model, "
            "text or settings); remove it or choose another state_path"
        )
    return saved
