"""LongRoPE's evolutionary search of per-pair long factors, on any model hf-posext patches, on CPU or GPU.

Ding et al. 2024, arXiv:2402.13753 sec. 3.2 (microsoft/LongRoPE ``evolution/``): a population
started from YaRN's factors and mutations of them; each round keeps the best half and adds
mutants and crossovers, non-decreasing, never a repeat; fitness = perplexity at the target length
(transformers' ``longrope`` full forward: every position with the long factors), of every token or
the last ``score_last`` of each window. The start is YaRN exactly past L_orig: its factors and its
attention factor 0.1 ln s + 1. ``keep_first=n`` scores every candidate with its first n positions on
plain RoPE (the paper's n-hat, fixed for the search). Resumable: the state is written atomically
after every round. Algorithm, defaults and measured results: docs/methods/longrope.md.

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

from .patching.shipped_rope import base_rope
from .files import write_text
from .longrope_population import STATE_VERSION, Population
from .methods import method_config
from .methods.base import BaseRope
from .methods.longrope import yarn_long_factors
from .patching import patched_method, unpatch_model
from .rope_utils import yarn_mscale
from .validation import real_number, whole_number


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
    base = _unpatched_base(model)
    original = base.original_max_position_embeddings
    documents, factor, length, population, rounds, step, score_last, attention_factor, keep_first = _check(
        model, input_ids, factor, length, population, rounds, step, original, score_last, attention_factor, keep_first
    )
    first = _start_factors(base, original, factor, start)
    settings = _settings(factor, length, population, seed, step, first, attention_factor, score_last, keep_first)
    fingerprint = _fingerprint(model, documents[:, :length], settings)
    search = Population(
        model, documents, factor, length, step, random.Random(seed), attention_factor, score_last, keep_first
    )
    state = Path(state_path) if state_path is not None else None
    try:
        start_key = search.key(list(first))
        history, done = _resume_or_seed(search, state, fingerprint, start_key, population)
        start_perplexity = search.perplexity(start_key)
        _evolve(search, population, done, rounds, history, state, fingerprint, progress)
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


def _unpatched_base(model: nn.Module) -> BaseRope:
    """The plain rope of ``model`` the factors are searched over (a shipped scaling's own frequencies left
    out); refuses a model hf-posext has patched."""
    previous = patched_method(model)
    if previous is not None:
        raise ValueError(
            f"search_longrope needs an unpatched model; this one is patched with {previous.name!r} "
            "(hf_posext.unpatch_model first)"
        )
    return base_rope(model.config, method_config("longrope"), override=True)


def _settings(
    factor: float,
    length: int,
    population: int,
    seed: int,
    step: float,
    first: list[float],
    attention_factor: float,
    score_last: int,
    keep_first: int,
) -> dict[str, Any]:
    """The search's settings as its state file's fingerprint holds them."""
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
    return settings


def _resume_or_seed(
    search: Population, state: Path | None, fingerprint: str, start: tuple[float, ...], population: int
) -> tuple[list[dict[str, Any]], int]:
    """The population, evaluations and random state of ``state``'s search where that file exists (its history
    and rounds run returned), else the starting population around ``start`` (no history, no round run)."""
    if state is not None and state.exists():
        return search.restore(_read_state(state, fingerprint))
    search.seed(start, population)
    return [], 0


def _evolve(
    search: Population,
    population: int,
    done: int,
    rounds: int,
    history: list[dict[str, Any]],
    state: Path | None,
    fingerprint: str,
    progress: bool,
) -> None:
    """Evaluate the population, then run the rounds after the ``done`` ones (a resumed search) up to ``rounds``,
    appending each round's entry to ``history`` and writing the state file after each."""
    bar = tqdm(total=rounds, initial=min(done, rounds), desc="longrope search", disable=not progress)
    for candidate in search.population:
        search.perplexity(candidate)
    for round_index in range(done, rounds):
        search.next_generation(population)
        _, best = search.best()
        history.append({"round": round_index + 1, "best_perplexity": best, "evaluated": len(search.evaluated)})
        if state is not None:
            write_text(state, json.dumps(search.state(fingerprint, round_index + 1, history)))
        bar.update(1)
        bar.set_postfix(best_ppl=f"{best:.4g}")
    bar.close()


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
