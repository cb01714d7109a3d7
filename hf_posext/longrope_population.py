"""LongRoPE's evolutionary population for [`search_longrope`][hf_posext.search_longrope]: candidates, scores, operators.

Ding et al. 2024, arXiv:2402.13753 sec. 3.2: mutations resample factors on a grid between their
neighbours (non-decreasing by construction), crossovers take each factor from either parent; a round
keeps the best half and refills with both, never a repeat. Split from `longrope_search` (the search's
checks, start, resumption and rounds) so that each module reads in one sitting.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
import torch.nn as nn
from transformers.utils import logging as transformers_logging

from .eval.perplexity import sequence_nll
from .patching import patch_model

#: Version of the state file's layout (a state of another version is refused, not misread).
STATE_VERSION = 1


class Population:
    """The population, every candidate evaluated so far, and the random state: what a state file holds.

    Its candidates are tuples of factors rounded to 6 digits (`key`); `perplexity` scores one, memoised.
    """

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
