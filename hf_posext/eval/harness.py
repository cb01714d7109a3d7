"""lm-evaluation-harness on a patched model: lm-eval's own ``simple_evaluate``, its numbers, its results JSON.

    model = hf_posext.patch_model(model, "yarn", factor=4)
    results = run_harness(model, tokenizer, ["hellaswag"])     # = lm_eval.simple_evaluate on HFLM(model)

The one thing added: lm-eval takes a model's context from ``max_position_embeddings`` (``resolve_max_length``,
lm-eval 0.4.13), which linear and dynamic patches keep at the original length (the convention vLLM and
SGLang read), so its rolling windows and truncation would never reach the extension; the patch's
``context_length`` is passed as ``max_length`` instead (docs/guides/evaluation.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..files import output_file
from ..patching import patch_info
from ..validation import require

#: The extra that installs lm-eval (pyproject.toml).
EXTRA = "harness"


def lm_eval_module(why: str = "hf-posext eval harness") -> Any:
    """``lm_eval``, or `hf_posext.validation.MissingExtra` naming ``pip install 'hf-posext[harness]'``."""
    return require("lm_eval", EXTRA, why)


def harness_max_length(model: Any) -> int | None:
    """The context lm-eval should give ``model``: the patch's ``context_length``, or ``None`` (lm-eval's own)."""
    info = patch_info(model)
    return int(info["context_length"]) if info and info.get("context_length") else None


def run_harness(
    model: Any,
    tokenizer: Any,
    tasks: list[str],
    *,
    include_path: str | os.PathLike | None = None,
    batch_size: int = 1,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    max_length: int | None = None,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` on ``model`` (patched or not), wrapped in lm-eval's ``HFLM``.

    Args:
        model: a causal LM (patched with [`patch_model`][hf_posext.patch_model] or not), on its device.
        tokenizer: its tokenizer.
        tasks: lm-eval task or group names (``lm_eval --tasks list``), or tasks under ``include_path``.
        include_path: a folder of task YAMLs (a local task: ``dataset_path: json`` and
            ``dataset_kwargs: {data_files: ...}`` runs offline).
        batch_size: requests per forward.
        limit: documents per task (lm-eval also takes a fraction below 1), ``None``: all.
        num_fewshot: lm-eval's few-shot count, ``None``: each task's own.
        max_length: the context lm-eval uses; default `harness_max_length`.
        seed: lm-eval's random, numpy, torch and few-shot seeds.
        metadata: given to every task (lm-eval's ``--metadata``); RULER's tasks read ``tokenizer`` (a name
            or path ``AutoTokenizer`` loads) and ``max_seq_lengths`` from it.

    Returns:
        lm-eval's results dict (``results``, ``configs``, ``versions``, ``n-shot``, ``config``...), without
        the per-sample logs.

    Raises:
        MissingExtra: lm-eval is not installed.
        ValueError: an unknown task name, naming it.
    """
    lm_eval = lm_eval_module()
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = None
    if include_path is not None:  # only local tasks: skip indexing lm-eval's thousands of task YAMLs
        local = TaskManager(include_path=str(include_path), include_defaults=False, metadata=metadata)
        manager = local if all(local.match_tasks([t]) for t in tasks) else None
    if manager is None:
        manager = TaskManager(include_path=str(include_path) if include_path is not None else None, metadata=metadata)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        where = f" or under {include_path}" if include_path is not None else " (--include-path adds a folder of YAMLs)"
        raise ValueError(f"unknown lm-eval task(s) {', '.join(map(repr, unknown))}: not among lm-eval's tasks{where}")
    lm = HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=batch_size,
        max_length=max_length or harness_max_length(model),
    )
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=manager,
        limit=limit,
        num_fewshot=num_fewshot,
        log_samples=False,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    if results is None:  # lm-eval returns None on the ranks other than 0 of a distributed run
        raise RuntimeError("lm_eval.simple_evaluate returned no results (not the main process?)")
    return dict(results)


def write_results(results: dict[str, Any], path: str | os.PathLike, overwrite: bool = False) -> Path:
    """``results`` as lm-eval's CLI writes them: ``json.dumps(indent=2, default=handle_non_serializable)``.

    Raises:
        ValueError: ``path`` exists (without ``overwrite``) or is a folder (`hf_posext.files.output_file`).
    """
    from lm_eval.utils import handle_non_serializable

    text = json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
    with output_file(path, overwrite=overwrite) as tmp:
        tmp.write_text(text + "\n")
    return Path(path)
