"""Run the RULER-style suite on an in-memory model: `ruler_accuracy`.

For each length and task, ``samples`` prompts are fitted to exactly ``length - budget`` tokens
(so a cell's prompts need no padding), generated greedily in batches with the task's token
budget, and scored. The model is used as it is: patch it once before the call. A ``store`` (the
CLI's `hf_posext.eval.report.ResultFile`) makes the run resume cell by cell.

Example::

    from hf_posext.eval.ruler import ruler_accuracy

    result = ruler_accuracy(model, tokenizer, lengths=[4096, 8192], tasks="niah_single_1,vt", samples=20)
    result["cells"]["vt/4096"]["accuracy"], result["average"]["4096"]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from ... import integration
from .fit import Prompt, fit_prompt, wrapper_for
from .score import METRICS, summary
from .tasks import TASKS, resolve_tasks, stratified_depth


class Store(Protocol):
    def get(self, key: str, compute: Callable[[], Any]) -> Any: ...


class _Memory:
    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.results:
            self.results[key] = compute()
        return self.results[key]


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def auto_batch_size(model: Any, length: int, memory_gib: float | None = None) -> int:
    """Prompts of ``length`` tokens that fit in memory at once: KV cache plus one layer's activations.

    Args:
        model: a transformers causal LM (its config gives the shapes).
        length: prompt + generated tokens.
        memory_gib: the memory to use; default: 80% of the GPU's free memory, 4 GiB on a CPU.
    """
    config = getattr(model, "config", None)
    if config is None:
        return 1
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or (hidden // heads if hidden else 0))
    inter = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    try:
        element = next(model.parameters()).element_size()
    except (AttributeError, StopIteration):
        element = 4
    if memory_gib is None:
        device = _device(model)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            memory_gib = 0.8 * free / 2**30
        else:
            memory_gib = 4.0
    per_sequence = length * element * (2 * layers * kv_heads * head_dim + 4 * hidden + 3 * inter)
    if integration.attention_implementation(config) == "eager":
        per_sequence += heads * length * length * 4  # the score matrix of one layer, fp32 softmax
    return max(1, int(memory_gib * 2**30 // max(1, per_sequence)))


def _generate(model: Any, tokenizer: Any, prompts: Sequence[Prompt], max_new_tokens: int) -> list[str]:
    ids = torch.tensor([p.input_ids for p in prompts], device=_device(model))
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False}
    if pad is not None:
        kwargs["pad_token_id"] = pad
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    return [tokenizer.decode(row[ids.shape[-1] :].tolist(), skip_special_tokens=True) for row in output]


def run_cell(
    model: Any,
    tokenizer: Any,
    task: str,
    length: int,
    samples: int,
    *,
    seed: int = 0,
    batch_size: int | None = None,
    chat_template: bool | None = None,
    max_new_tokens: int | None = None,
    bar: Any = None,
    finished: Mapping[int, dict[str, Any]] | None = None,
    on_prompt: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One (task, length) cell: fit ``samples`` prompts, generate, score.

    ``max_new_tokens`` caps generation below the task's budget (the prompts still leave the whole
    budget free, so they are RULER's); a cap can only lower a score, never raise it. ``finished``: the
    rows of an interrupted run by prompt index, reused where the prompt's seed and depth are the same;
    ``on_prompt(index, row)`` is called as each new row is scored (`hf_posext.eval.prompt_log`).

    Returns:
        ``{"task", "length", "accuracy", "n", "low", "high", "prompt_tokens", "batch_size",
        "seconds", "samples": [{"seed", "depth", "answers", "output", "score"}]}`` (accuracy and
        bounds in %).
    """
    spec = TASKS[task]
    wrapper = wrapper_for(tokenizer, chat_template)
    start = time.perf_counter()
    prompts = _fit_prompts(tokenizer, task, length, samples, seed, wrapper)
    size = batch_size or auto_batch_size(model, length)
    metric = METRICS[spec.metric]
    rows = _reused_rows(prompts, finished)
    if bar is not None:
        bar.update(len(rows))
    todo = [i for i in range(samples) if i not in rows]
    for first in range(0, len(todo), size):
        batch = todo[first : first + size]
        outputs = _generate(
            model,
            tokenizer,
            [prompts[i] for i in batch],
            min(spec.max_new_tokens, max_new_tokens or spec.max_new_tokens),
        )
        for i, output in zip(batch, outputs):
            prompt = prompts[i]
            rows[i] = {
                "seed": prompt.seed,
                "depth": prompt.depth,
                "answers": prompt.answers,
                "output": output,
                "score": metric(output, prompt.answers),
            }
            if on_prompt is not None:
                on_prompt(i, rows[i])
        if bar is not None:
            bar.update(len(batch))
    ordered = [rows[i] for i in range(samples)]
    return {
        "task": task,
        "length": length,
        **summary([r["score"] for r in ordered]),
        "prompt_tokens": len(prompts[0].input_ids),
        "batch_size": size,
        "seconds": round(time.perf_counter() - start, 1),
        "samples": ordered,
    }


def _fit_prompts(tokenizer: Any, task: str, length: int, samples: int, seed: int, wrapper: Any) -> list[Prompt]:
    """The cell's ``samples`` prompts, each fitted to its length at its stratified depth (seeded by its key)."""
    spec = TASKS[task]
    prompts: list[Prompt] = []
    hint = None
    for i in range(samples):
        key = f"{seed}/{task}/{length}/{i}"
        prompt = fit_prompt(
            tokenizer,
            spec,
            length,
            key,
            stratified_depth(i, samples, f"{seed}/{task}/{length}"),
            wrapper=wrapper,
            hint=hint,
        )
        hint = prompt.units
        prompts.append(prompt)
    return prompts


def _reused_rows(prompts: Sequence[Prompt], finished: Mapping[int, dict[str, Any]] | None) -> dict[int, dict[str, Any]]:
    """The rows of an interrupted run whose prompt (seed and depth) is the same as ours, by prompt index."""
    rows: dict[int, dict[str, Any]] = {}
    for i, prompt in enumerate(prompts):
        row = (finished or {}).get(i)
        if isinstance(row, dict) and (row.get("seed"), row.get("depth")) == (prompt.seed, prompt.depth):
            rows[i] = row
    return rows


def ruler_accuracy(
    model: nn.Module,
    tokenizer: Any,
    lengths: Sequence[int],
    tasks: str | Sequence[str] = "all",
    samples: int = 20,
    *,
    seed: int = 0,
    batch_size: int | None = None,
    chat_template: bool | None = None,
    max_new_tokens: int | None = None,
    store: Store | None = None,
    progress: bool = True,
    prompts: Any = None,
) -> dict[str, Any]:
    """RULER-style accuracy of ``model`` per task and length, with sample counts and Wilson intervals.

    Args:
        model: a causal LM with transformers' ``generate`` (patched beforehand if wanted).
        tokenizer: its tokenizer; its chat template is applied when it has one.
        lengths: target lengths in tokens (prompt + answer budget), as RULER's ``max_seq_length``.
        tasks: task and group names (``"all"``, ``"niah"``, ``"vt,cwe"``...), see `resolve_tasks`.
        samples: prompts per (task, length).
        seed: seeds every prompt; two models given the same seed are asked the same questions.
        batch_size: prompts per ``generate``; ``None``: `auto_batch_size`.
        chat_template: ``None``: use the tokenizer's if any; ``False``: plain text.
        max_new_tokens: caps every task's generation budget (to save time; it can only lower scores).
        store: where finished cells are kept and looked up (``get(key, compute)``); ``"task/length"`` keys.
        progress: show a tqdm bar.
        prompts: where each finished prompt of a cell is kept until the cell is done, by ``"task/length"`` keys
            (a `hf_posext.eval.prompt_log.PromptLog`'s ``finished``, ``add``, ``forget``): a cell cut short
            resumes from its finished prompts.

    Returns:
        ``{"cells": {"task/length": cell}, "average": {"length": summary}}``; a cell as
        `run_cell`, an average over the tasks' pooled samples (accuracy, n, low, high in %).

    Raises:
        ValueError: unknown tasks, bad lengths or samples, or a length too short for a task.
    """
    names = resolve_tasks(tasks if isinstance(tasks, str) else list(tasks))
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be positive ints, got {list(lengths)!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    store = store or _Memory()
    options = {"seed": seed, "batch_size": batch_size, "chat_template": chat_template, "max_new_tokens": max_new_tokens}
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    cells: dict[str, Any] = {}
    bar = tqdm(total=len(lengths) * len(names) * samples, desc="ruler", disable=not progress)
    try:
        with torch.inference_mode():
            for length in lengths:
                for task in names:
                    cells[f"{task}/{length}"] = cell = _stored_cell(
                        model, tokenizer, task, length, samples, store, prompts, bar, options
                    )
                    bar.set_postfix(L=length, task=task, acc=f"{cell['accuracy']:.0f}")
    finally:
        bar.close()
        if hasattr(model, "train"):
            model.train(was_training)
    average = {
        str(length): summary([r["score"] for t in names for r in cells[f"{t}/{length}"]["samples"]])
        for length in lengths
    }
    return {"tasks": names, "lengths": list(lengths), "samples": samples, "cells": cells, "average": average}


def _stored_cell(
    model: Any,
    tokenizer: Any,
    task: str,
    length: int,
    samples: int,
    store: Store,
    prompts: Any,
    bar: Any,
    options: dict[str, Any],
) -> dict[str, Any]:
    """The cell ``task/length`` from ``store``, run (`run_cell` with ``options``) and kept there if it is not.

    A cell's finished prompts come from and go to ``prompts`` (see `ruler_accuracy`), which forgets
    them once the cell is stored; a cell found whole in ``store`` advances ``bar`` by its samples.
    """
    key = f"{task}/{length}"

    def compute() -> dict[str, Any]:
        return run_cell(
            model,
            tokenizer,
            task,
            length,
            samples,
            **options,
            bar=bar,
            finished=prompts.finished(key) if prompts is not None else None,
            on_prompt=(lambda i, row: prompts.add(key, i, row)) if prompts is not None else None,
        )

    before = bar.n
    cell = store.get(key, compute)
    if prompts is not None:
        prompts.forget(key)
    if bar.n == before:
        bar.update(samples)
    return cell


__all__ = ["auto_batch_size", "ruler_accuracy", "run_cell"]
