"""Fit a RULER prompt to an exact token length with the model's own tokenizer.

The prompt is the task's user message wrapped in the tokenizer's chat template when it has one
(RULER's model template), followed by the task's answer prefix, and it has exactly
``length - task.max_new_tokens`` tokens: the answer budget is left free, as RULER does. A binary
search picks the number of haystack units (the largest that fits), then a second one the number
of characters of the draft's continuation that fills the remaining tokens; a tokenizer that
merges across the last characters is handled by a scan and, failing that, one unit fewer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .haystack import occurrences
from .tasks import Draft, Task

_MARK = "\x00RULER-CONTENT\x00"


@dataclass(frozen=True)
class Wrapper:
    """How a user message becomes the model's text: ``head + message + tail + answer prefix``.

    ``special`` says whether the tokenizer adds its own special tokens (BOS...) when encoding:
    not when a chat template already wrote them.
    """

    head: str = ""
    tail: str = ""
    special: bool = True
    chat: bool = False

    def text(self, draft: Draft, pad: int) -> str:
        prefix = draft.answer_prefix.lstrip() if self.chat else draft.answer_prefix
        return self.head + draft.prompt(pad) + self.tail + prefix


def wrapper_for(tokenizer: Any, chat_template: bool | None = None) -> Wrapper:
    """The tokenizer's chat template around one user turn and the assistant's start, if it has one.

    Args:
        tokenizer: a transformers tokenizer (anything with ``encode`` and, for chat, ``apply_chat_template``).
        chat_template: ``None``: use it when the tokenizer has one; ``True`` requires it; ``False``: plain text.

    Raises:
        ValueError: ``chat_template=True`` for a tokenizer without one.
    """
    has = bool(getattr(tokenizer, "chat_template", None))
    if chat_template and not has:
        raise ValueError("chat_template=True, but the tokenizer has no chat template")
    if not (has if chat_template is None else chat_template):
        return Wrapper()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _MARK}], tokenize=False, add_generation_prompt=True
    )
    head, tail = text.split(_MARK)
    return Wrapper(head, tail, special=False, chat=True)


@dataclass
class Prompt:
    """One fitted prompt.

    Attributes:
        task: the task's name.
        length: the target length (prompt + answer budget).
        input_ids: the prompt's tokens, exactly ``length - max_new_tokens`` of them.
        text: what was tokenized (chat template and answer prefix included).
        answers: the references.
        depth: the first answer's needle depth, or ``None``.
        units: how many haystack units the prompt holds.
        seed: the draft's seed (a retry appends ``#k``).
    """

    task: str
    length: int
    input_ids: list[int] = field(repr=False)
    text: str = field(repr=False)
    answers: list[str]
    depth: float | None
    units: int
    seed: str


def _count(tokenizer: Any, wrapper: Wrapper, draft: Draft, pad: int = 0) -> int:
    return len(tokenizer.encode(wrapper.text(draft, pad), add_special_tokens=wrapper.special))


def _largest_fitting(fits: Any, hint: int) -> int:
    """The largest ``n >= 1`` with ``fits(n)``, galloping from ``hint``; ``fits(1)`` is true.

    Steps double from 1, so a hint off by ``d`` costs about ``2 log2(d)`` calls.
    """
    step = 1
    if fits(hint):
        low, high = hint, hint + step
        while fits(high):
            low, step = high, step * 2
            high = low + step
    else:
        high, low = hint, max(1, hint - step)
        while not fits(low):
            high, step = low, step * 2
            low = max(1, high - step)
    while high - low > 1:  # invariant: low fits, high does not
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def _fill(tokenizer: Any, wrapper: Wrapper, draft: Draft, budget: int) -> int | None:
    """Characters of the continuation that bring the prompt to exactly ``budget`` tokens, or ``None``."""
    low, high = 0, len(draft.continuation)
    longest = _count(tokenizer, wrapper, draft, high)
    if longest <= budget:
        return high if longest == budget else None
    # Narrow the search to a window around the linear guess (characters per token of the continuation).
    shortest = _count(tokenizer, wrapper, draft, 0)
    guess = round((budget - shortest) * high / max(1, longest - shortest))
    below, above = max(0, guess - 8), min(high, guess + 8)
    if _count(tokenizer, wrapper, draft, below) <= budget < _count(tokenizer, wrapper, draft, above):
        low, high = below, above
    while high - low > 1:  # invariant: low fits, high does not (token counts are near-monotone in pad)
        mid = (low + high) // 2
        if _count(tokenizer, wrapper, draft, mid) <= budget:
            low = mid
        else:
            high = mid
    if _count(tokenizer, wrapper, draft, low) == budget:
        return low
    for pad in range(max(0, low - 24), min(len(draft.continuation), low + 24) + 1):
        if _count(tokenizer, wrapper, draft, pad) == budget:
            return pad
    return None


def minimum_length(tokenizer: Any, task: Task, length: int, wrapper: Wrapper | None = None, seed: str = "0") -> int:
    """The shortest target length the task's prompt fits in (one haystack unit and the answer budget).

    ``length`` is the target asked for: a few tasks (``cwe``) take another shape below 4096 tokens.
    """
    wrapper = wrapper or wrapper_for(tokenizer)
    return _count(tokenizer, wrapper, task.build(seed, 1, 0.5, length)) + task.max_new_tokens


def fit_prompt(
    tokenizer: Any,
    task: Task,
    length: int,
    seed: str,
    depth: float = 0.5,
    *,
    wrapper: Wrapper | None = None,
    hint: int | None = None,
    attempts: int = 8,
) -> Prompt:
    """The task's prompt for ``seed`` with exactly ``length - task.max_new_tokens`` tokens.

    A draft whose answers do not appear in the fitted prompt as often as the task says (a value
    that happens to occur in the prose, a key drawn twice) is drawn again with the seed ``seed#k``.

    Args:
        tokenizer: the model's tokenizer (``encode(text, add_special_tokens=...)``).
        task: from `hf_posext.eval.ruler.tasks.TASKS`.
        length: the target length in tokens, answer budget included.
        seed: any string; the same seed gives the same prompt.
        depth: the first answer's needle depth in [0, 1] (NIAH and ``qa``).
        wrapper: from `wrapper_for` (default: the tokenizer's chat template if any).
        hint: a guess of the number of haystack units (the previous prompt's), to save tokenizer calls.
        attempts: redraws allowed before giving up.

    Raises:
        ValueError: ``length`` too short for the task's template, or no exact fit found.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")
    wrapper = wrapper or wrapper_for(tokenizer)
    budget = length - task.max_new_tokens
    for attempt in range(attempts):
        draft_seed = seed if attempt == 0 else f"{seed}#{attempt}"
        drafts: dict[int, Draft] = {}

        def draft(n: int, draft_seed: str = draft_seed, drafts: dict[int, Draft] = drafts) -> Draft:
            if n not in drafts:
                drafts[n] = task.build(draft_seed, n, depth, length)
            return drafts[n]

        minimum = _count(tokenizer, wrapper, draft(1))
        if minimum > budget:
            raise ValueError(
                f"length {length} is too short for {task.name}: its prompt needs at least {minimum} tokens "
                f"plus {task.max_new_tokens} for the answer"
            )
        n = _largest_fitting(lambda m: _count(tokenizer, wrapper, draft(m)) <= budget, max(1, hint or 1))
        pad = None
        for units in range(n, max(0, n - 3), -1):  # one or two units fewer leave a longer stretch to fill
            pad = _fill(tokenizer, wrapper, draft(units), budget)
            if pad is not None:
                break
        if pad is None:
            raise ValueError(f"no prompt of exactly {budget} tokens for {task.name} with seed {seed!r}")
        chosen = draft(units)
        text = wrapper.text(chosen, pad)
        if all(occurrences(text, a) == c for a, c in zip(chosen.answers, chosen.counts)):
            ids = tokenizer.encode(text, add_special_tokens=wrapper.special)
            return Prompt(task.name, length, list(ids), text, list(chosen.answers), chosen.depth, units, draft_seed)
    raise ValueError(
        f"{task.name}: no draft with its answers the right number of times in {attempts} seeds from {seed!r}"
    )


__all__ = ["Prompt", "Wrapper", "fit_prompt", "minimum_length", "wrapper_for"]
