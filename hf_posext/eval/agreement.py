"""The chat tax: how far an extended instruct model's short chat answers move from the base model's.

Short instructions are built offline from the standard library's docstrings (`docstring_instructions`:
a function's signature and docstring, and a question about it), asked through the chat template; the
base model's greedy answers are the reference (`greedy_answers`). A model agrees with the base
on an instruction when its first ``max_new_tokens`` greedy tokens are the base's exactly; the mean
log-likelihood per token of the base's answers under the model (`answer_loglik`) measures the
same drift without the cliff of exact matching (static YaRN's short-prompt tax: Qwen3 and Qwen2.5
cards; docs/results/chat_tax.md).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..data import Split, stdlib_files

#: The questions asked about a function; one per instruction, chosen by the instruction's seed.
QUESTIONS = (
    "Explain in one sentence what this function does.",
    "What does this function return?",
    "Give a short example of calling this function.",
    "Summarize the purpose of this function for a beginner.",
)


def _functions(path: Path) -> list[tuple[str, str]]:
    """``(signature, docstring)`` of the documented top-level functions and methods of one source file."""
    try:
        tree = ast.parse(path.read_bytes().decode("utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return []  # the standard library's test data holds deliberately broken files
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if doc is None or not 40 <= len(doc) <= 600:
            continue
        found.append((f"def {node.name}({ast.unparse(node.args)}):", doc))
    return found


def docstring_instructions(split: Split, count: int, seed: int = 0, exclude: str = "pydoc_data") -> list[str]:
    """``count`` instructions about documented functions of the standard library's ``split`` files.

    The ``test`` split's files are held out from every training run of the recipe (``stdlib`` data
    reads the ``train`` split), so its instructions are disjoint from any training prompt.

    Raises:
        ValueError: fewer documented functions than ``count``.
    """
    functions = [item for path in stdlib_files(split) if exclude not in path.parts for item in _functions(path)]
    if len(functions) < count:
        raise ValueError(f"the stdlib {split} split holds {len(functions)} documented functions, fewer than {count}")
    rng = random.Random(seed)
    chosen = rng.sample(functions, count)
    return [f"```python\n{signature}\n    '''{doc}'''\n```\n\n{rng.choice(QUESTIONS)}" for signature, doc in chosen]


def chat_prompt_ids(tokenizer: Any, instruction: str) -> list[int]:
    """The ids of ``instruction`` as one user turn, with the template's prompt for the assistant's answer."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def greedy_answer(model: Any, tokenizer: Any, instruction: str, max_new_tokens: int = 32) -> list[int]:
    """The model's greedy answer to ``instruction`` (token ids, up to and including an end of turn)."""
    prompt = torch.tensor([chat_prompt_ids(tokenizer, instruction)], device=model.device)
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    return out[0, prompt.shape[1] :].tolist()


def greedy_answers(
    model: Any, tokenizer: Any, instructions: Sequence[str], max_new_tokens: int = 32
) -> list[list[int]]:
    """`greedy_answer` for each instruction."""
    return [greedy_answer(model, tokenizer, instruction, max_new_tokens) for instruction in instructions]


@torch.no_grad()
def answer_loglik(model: Any, tokenizer: Any, instruction: str, answer: Sequence[int]) -> float:
    """Mean log-likelihood per token of ``answer`` (ids) after ``instruction``'s chat prompt, teacher-forced."""
    prompt = chat_prompt_ids(tokenizer, instruction)
    ids = torch.tensor([prompt + list(answer)], device=model.device)
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return float(logprobs.gather(1, ids[0, len(prompt) :, None]).mean())


def agreement(answers: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> float:
    """The share of answers whose tokens equal the reference answer's exactly."""
    if len(answers) != len(references) or not answers:
        raise ValueError(f"{len(answers)} answers for {len(references)} references: need as many, at least one")
    return sum(list(a) == list(r) for a, r in zip(answers, references)) / len(answers)


def self_distilled_conversations(
    model: Any, tokenizer: Any, instructions: Sequence[str], max_new_tokens: int = 64
) -> list[dict[str, Any]]:
    """Conversation records (``{"messages": [...]}``) whose answers are the model's own greedy ones.

    Trained beside long data, they ask the extended model to keep answering short chats as the
    base did (self-distillation; LongRoPE2's mixed-context training keeps short scores the same
    way). Answers that do not end their turn within ``max_new_tokens`` are cut at the last full stop.
    """
    eos = tokenizer.eos_token_id
    records = []
    for instruction in instructions:
        ids = greedy_answer(model, tokenizer, instruction, max_new_tokens)
        ended = eos in ids
        text = tokenizer.decode(ids[: ids.index(eos)] if ended else ids, skip_special_tokens=True).strip()
        if not ended and "." in text:
            text = text[: text.rindex(".") + 1]
        if text:
            records.append(
                {"messages": [{"role": "user", "content": instruction}, {"role": "assistant", "content": text}]}
            )
    return records
