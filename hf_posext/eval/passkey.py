"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention"; the YaRN paper's table 5).

The YaRN repo's prompt, greedy 10 tokens, correct when the first integer is the key; keys at
chosen depths give a depth x length grid (docs/guides/evaluation.md).

    from hf_posext.eval import passkey_accuracy
    result = passkey_accuracy(model, tokenizer, lengths=[4096, 8192], depths=[0, 0.5, 1], trials=5)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..data import Tokenizer
from .ruler.score import summary, wilson_interval

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
#: Keys are drawn uniformly from this range, as in the reference (1 to 50000).
KEY_RANGE = (1, 50000)

_FILLER_SENTENCES = [s.strip() + "." for s in FILLER.split(".") if s.strip()]


def key_line(key: int) -> str:
    """The sentence carrying the key."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def build_prompt(key: int, n_filler: int, depth: float, task: str = TASK) -> str:
    """The passkey prompt with ``n_filler`` filler sentences, the key after ``round(depth * n_filler)``.

    Args:
        key: the pass key N.
        n_filler: how many filler sentences surround the key (the five sentences cycle).
        depth: where the key sits in the filler, 0 (first) to 1 (last, next to the question).
        task: the leading instruction line; ``""`` drops it.

    Raises:
        ValueError: a depth outside [0, 1] or a negative ``n_filler``.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1] (0 = start of the filler, 1 = its end), got {depth!r}")
    if n_filler < 0:
        raise ValueError(f"n_filler must be >= 0, got {n_filler!r}")
    filler = [_FILLER_SENTENCES[i % len(_FILLER_SENTENCES)] for i in range(n_filler)]
    cut = round(depth * n_filler)
    lines = [task] if task else []
    lines += [" ".join(filler[:cut]), key_line(key), " ".join(filler[cut:]), QUESTION]
    return "\n".join(lines)


def chat_text(tokenizer: Any, prompt: str) -> str:
    """``prompt`` as one user turn rendered by the tokenizer's chat template, the assistant's answer prompted.

    Instruct models are asked through their template; the prompt's last line ("... The pass key is")
    stays, so the answer is read as from a plain prompt.
    """
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )


def _encode(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    if not chat:
        return list(tokenizer.encode(prompt))
    # the template writes its own special tokens
    return list(tokenizer.encode(chat_text(tokenizer, prompt), add_special_tokens=False))


def _n_tokens(tokenizer: Tokenizer, text: str, chat: bool = False) -> int:
    return len(_encode(tokenizer, text, chat))


def fit_filler(tokenizer: Tokenizer, length: int, task: str = TASK, chat: bool = False) -> int:
    """The largest number of filler sentences whose prompt is at most ``length`` tokens.

    The longest key (5 digits) is used, so every prompt with that filler fits; with ``chat``, the
    prompt is counted as the chat template renders it (`chat_text`).

    Raises:
        ValueError: if even a prompt without filler is longer than ``length``.
    """
    probe_key = KEY_RANGE[1]
    if _n_tokens(tokenizer, build_prompt(probe_key, 0, 0.5, task), chat) > length:
        raise ValueError(f"length {length} is too short for the passkey prompt even without filler")
    low, high = 0, 1
    while _n_tokens(tokenizer, build_prompt(probe_key, high, 0.5, task), chat) <= length:
        low, high = high, high * 2
    while high - low > 1:  # invariant: low fits, high does not
        mid = (low + high) // 2
        if _n_tokens(tokenizer, build_prompt(probe_key, mid, 0.5, task), chat) <= length:
            low = mid
        else:
            high = mid
    return low


_INTEGER = re.compile(r"\d+")


def parse_answer(text: str) -> int | None:
    """The first integer in a continuation (the reference's scoring rule), or ``None``."""
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


@dataclass
class PasskeyResult:
    """Accuracy by (depth, length).

    Attributes:
        lengths: target prompt lengths in tokens (columns).
        depths: key depths in [0, 1] (rows).
        trials: prompts per cell.
        correct: ``correct[d][l]`` = right answers at ``depths[d]``, ``lengths[l]``.
        prompt_tokens: the actual prompt length per length (at most the target).
        samples: every trial: length, depth, key, continuation, answer, correct.
    """

    lengths: list[int]
    depths: list[float]
    trials: int
    correct: list[list[int]]
    prompt_tokens: list[int]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def accuracy(self) -> list[list[float]]:
        """``[depth][length]`` accuracy in [0, 1]."""
        return [[c / self.trials for c in row] for row in self.correct]

    def accuracy_by_length(self) -> list[float]:
        """Accuracy per length, over all depths."""
        return [
            sum(row[i] for row in self.correct) / (self.trials * len(self.depths)) for i in range(len(self.lengths))
        ]

    def intervals(self) -> list[list[tuple[float, float]]]:
        """``[depth][length]`` 95% Wilson interval of each cell's accuracy (``trials`` keys each)."""
        return [[wilson_interval(c, self.trials) for c in row] for row in self.correct]

    def summary_by_length(self) -> list[dict[str, float | int]]:
        """Per length, over all depths: accuracy, sample count and Wilson bounds, in % (as the RULER suite)."""
        return [
            summary(
                [1.0] * sum(row[i] for row in self.correct)
                + [0.0] * (self.trials * len(self.depths) - sum(row[i] for row in self.correct))
            )
            for i in range(len(self.lengths))
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "accuracy": self.accuracy(),
            "accuracy_by_length": self.accuracy_by_length(),
            "interval": self.intervals(),
            "by_length": self.summary_by_length(),
        }


def _generate(model: Any, input_ids: torch.Tensor, max_new_tokens: int, pad_token_id: int | None) -> torch.Tensor:
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False}
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    return output[0, input_ids.shape[-1] :]


def passkey_accuracy(
    model: nn.Module,
    tokenizer: Tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    trials: int = 5,
    *,
    seed: int = 0,
    max_new_tokens: int = 10,
    task: str = TASK,
    progress: bool = True,
    chat: bool = False,
    finished: Mapping[int, dict[str, Any]] | None = None,
    on_prompt: Callable[[int, dict[str, Any]], None] | None = None,
) -> PasskeyResult:
    """Passkey retrieval accuracy for each (depth, length), by greedy generation.

    Args:
        model: anything with transformers' ``generate(input_ids=..., max_new_tokens=..., do_sample=False)``.
        tokenizer: with ``encode(text) -> ids`` and ``decode(ids) -> text``.
        lengths: target prompt lengths in tokens; each prompt is the longest that fits.
        depths: key positions, 0 (start of the filler) to 1 (end).
        trials: prompts per cell, each with its own random key.
        seed: seeds the keys, so two models are asked the same questions.
        max_new_tokens: continuation length (10 in the reference).
        task: the instruction line heading the prompt (``""`` for none).
        progress: show a tqdm bar.
        chat: ask through the tokenizer's chat template (`chat_text`), as instruct models are asked.
        finished: samples of an interrupted run by prompt index (length-major, then depth, then trial), as
            ``on_prompt`` was given them: reused where the prompt's length, depth and key are the same.
        on_prompt: called with each new sample as its prompt finishes (to keep it: `prompt_log`).

    Raises:
        ValueError: bad lengths, depths or trials.
    """
    _check_grid(lengths, depths, trials)
    rng = random.Random(seed)
    fillers = [fit_filler(tokenizer, length, task, chat) for length in lengths]
    result = PasskeyResult(
        lengths=list(lengths),
        depths=[float(d) for d in depths],
        trials=trials,
        correct=[[0] * len(lengths) for _ in depths],
        prompt_tokens=[_n_tokens(tokenizer, build_prompt(KEY_RANGE[1], n, 0.5, task), chat) for n in fillers],
    )
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    device = _model_device(model)
    bar = tqdm(total=len(lengths) * len(depths) * trials, desc="passkey", disable=not progress)
    try:
        with torch.inference_mode():
            for li, (length, n_filler) in enumerate(zip(lengths, fillers)):
                for di, depth in enumerate(result.depths):
                    for trial in range(trials):
                        key = rng.randint(*KEY_RANGE)  # drawn for every prompt, done or not: the same keys
                        index = (li * len(depths) + di) * trials + trial
                        sample = (finished or {}).get(index)
                        if not _same_prompt(sample, length, depth, key):
                            prompt = build_prompt(key, n_filler, depth, task)
                            ids = torch.tensor([_encode(tokenizer, prompt, chat)], device=device)
                            continuation = tokenizer.decode(_generate(model, ids, max_new_tokens, pad).tolist())
                            sample = _key_record(length, depth, key, continuation)
                            if on_prompt is not None:
                                on_prompt(index, sample)
                        result.correct[di][li] += bool(sample["correct"])
                        result.samples.append(sample)
                        bar.update(1)
                bar.set_postfix(L=length, acc=f"{result.accuracy_by_length()[li]:.2f}")
    finally:
        bar.close()
        if hasattr(model, "train"):
            model.train(was_training)
    return result


def _check_grid(lengths: Sequence[int], depths: Sequence[float], trials: int) -> None:
    """Raise `ValueError` naming the bad lengths, depths or trials."""
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be positive ints, got {list(lengths)!r}")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"depths must lie in [0, 1], got {list(depths)!r}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}")


def _model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter; the CPU for a model without any."""
    try:
        return next(model.parameters()).device if hasattr(model, "parameters") else torch.device("cpu")
    except StopIteration:
        return torch.device("cpu")


def _same_prompt(sample: Any, length: int, depth: float, key: int) -> bool:
    """Whether a finished ``sample`` answered this prompt (its length, depth and key), so it is reused."""
    if not isinstance(sample, dict):
        return False
    return (sample.get("length"), sample.get("depth"), sample.get("key")) == (length, depth, key)


def _key_record(length: int, depth: float, key: int, continuation: str) -> dict[str, Any]:
    """One prompt's record: where the key was, the model's continuation, the integer it gave, and whether right."""
    answer = parse_answer(continuation)
    return {
        "length": length,
        "depth": depth,
        "key": key,
        "continuation": continuation,
        "answer": answer,
        "correct": answer == key,
    }
