"""``hf-posext demo``: extend a tiny model with every method and see what each one does.

Pretrains (once, cached) a tiny byte-level Llama and an ALiBi one, patches the first with each
method without fine-tuning, prints perplexity at 1x-16x the training length
(docs/getting_started.md#the-demo).

    hf-posext demo                      # 3-5 CPU-minutes on 2 cores, then cached
    hf-posext demo --quick              # the same pipeline shrunk to seconds
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import encode_documents, iter_local_documents, stdlib_files
from ..eval.perplexity import truncated_perplexity
from ..eval.report import environment, markdown_table, plot_curves, write_csv, write_json
from ..files import write_text
from ..methods import available_methods, method_class
from ..patching import patch_model, unpatch_model
from .tinylm import TinyLMConfig, is_cached, pretrain

#: The rows of the demo table after the model as trained: every registered RoPE extension
#: method, each dynamic variant next to its static one (``ntk``, ``dynamic_ntk``).
ROPE_METHODS = tuple(
    sorted(
        (m for m in available_methods() if method_class(m).scales_rope),
        key=lambda m: (m.removeprefix("dynamic_"), method_class(m).dynamic),
    )
)
#: The ones that set their own factor from the input length.
DYNAMIC_METHODS = tuple(m for m in ROPE_METHODS if method_class(m).dynamic)


@dataclass(frozen=True)
class DemoConfig:
    """The demo's sizes.

    Args:
        model: the pretraining run.
        multiples: context lengths as multiples of the training length.
        documents: held-out stdlib files evaluated (each at least ``max(multiples) * L_train`` bytes).
        seed: which held-out files are drawn.
        from_scratch: non-RoPE position methods (``alibi``, ``sinusoidal``, ``learned``) for which a
            second model is trained from scratch with the same settings and added as a row;
            names that are not registered are skipped.
    """

    # 600 steps of 16 x 128 bytes: two models (RoPE and ALiBi) train in ~4.6 CPU-minutes (400 steps: 3.6, but
    # LongRoPE's default factors then beat YaRN at 8x, 7.88 against 7.90: the ordering the demo shows blurs).
    model: TinyLMConfig = TinyLMConfig(batch_size=16)
    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    documents: int = 16
    seed: int = 0
    from_scratch: tuple[str, ...] = ("alibi",)


FULL = DemoConfig()
QUICK = DemoConfig(
    model=TinyLMConfig(
        seq_len=32,
        steps=25,
        batch_size=8,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        warmup_steps=5,
        max_train_bytes=1_000_000,
    ),
    documents=2,
)


def held_out_documents(tokenizer: Any, min_tokens: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` held-out stdlib files of at least ``min_tokens`` tokens, drawn reproducibly.

    Raises:
        ValueError: if fewer than ``count`` held-out files are long enough.
    """
    files = [p for p in stdlib_files("test") if p.stat().st_size >= min_tokens]
    if len(files) < count:
        raise ValueError(f"only {len(files)} held-out stdlib files have {min_tokens} bytes; asked for {count}")
    chosen = sorted(random.Random(seed).sample(files, count))
    docs = encode_documents(iter_local_documents(chosen), tokenizer)
    return [d for d in docs if d.numel() >= min_tokens]


def demo_threads() -> int:
    """Torch threads for the demo: torch's default, but no more than the cores other work leaves free (at least 1).

    The demo's ops are tiny (0.85M parameters, 16 x 128 tokens), and OpenMP threads wait for each other at
    every one: on an idle 2-core machine two threads ran a training step in 0.11 s, but on 2 cores shared
    with another job two threads took 1.1-3.1 s a step against 0.35 s for one (4-8x the CPU time), the
    56 minutes a newcomer saw (docs/getting_started.md#the-demo). Free cores: ``os.cpu_count()`` less the
    1-minute load average when the demo starts.
    """
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(torch.get_num_threads(), int((os.cpu_count() or 1) - busy)))


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads, then give back the count it found."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_demo(
    config: DemoConfig = FULL,
    cache_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Train (or load) the tiny model, extend it with every method, measure perplexity.

    Args:
        config: `FULL` or `QUICK` (or your own sizes).
        cache_dir: where the trained model is cached (default ``~/.cache/hf_posext``).
        out_dir: where ``demo.{json,csv,md,png}`` go; ``None`` writes nothing.
        progress: show progress bars.

    Returns:
        ``{"table": markdown, "results": {method: [{length, multiple, factor, perplexity, ...}]},
        "train": training info, "cached": {model: whether it came from the cache}, "environment": ...,
        "seconds": wall time, "cpu_seconds": this process's CPU time}``.
    """
    with torch_threads(demo_threads()):
        return _run_demo(config, cache_dir, out_dir, progress)


def _run_demo(
    config: DemoConfig, cache_dir: str | Path | None, out_dir: str | Path | None, progress: bool
) -> dict[str, Any]:
    start, cpu_start = time.perf_counter(), time.process_time()
    cached = {"rope": is_cached(config.model, cache_dir)}
    model, tokenizer, train_info = pretrain(config.model, cache_dir, progress=progress)
    train_len = config.model.seq_len
    lengths = [m * train_len for m in config.multiples]
    docs = held_out_documents(tokenizer, lengths[-1] + 1, config.documents, config.seed)
    n_scored = train_len - 1

    def measure(lengths_: list[int]) -> list[dict[str, Any]]:
        points = truncated_perplexity(model, docs, lengths_, score_last=n_scored, end_at=lengths[-1], progress=False)
        return [p.to_dict() for p in points]

    header = ["method"] + [f"{n} ({m}x)" for n, m in zip(lengths, config.multiples)]
    results: dict[str, list[dict[str, Any]]] = {"none": measure(lengths)}
    for row in results["none"]:
        row.update(multiple=row["length"] // train_len, factor=1.0)
    scratch = [p for p in config.from_scratch if p in available_methods()]
    width = max(len(name) for name in ["none", *ROPE_METHODS, *(f"{p} (from scratch)" for p in scratch)])

    def show(name: str, rows: list[dict[str, Any]]) -> None:
        if progress:
            print(f"  {name:<{width}} " + " ".join(f"{r['perplexity']:12.3f}" for r in rows), flush=True)

    if progress:
        print("  perplexity with L tokens of context")
        print(f"  {header[0]:<{width}} " + " ".join(f"{h:>12}" for h in header[1:]))
    show("none", results["none"])
    for method in ROPE_METHODS:
        rows = []
        if method in DYNAMIC_METHODS:
            factor = float(max(config.multiples))
            # One forward per cut at s(L), as transformers and the YaRN repo evaluate dynamic scaling;
            # the exact causal variant (exact_cache=True) needs one attention call per position past L_orig.
            patch_model(model, method, factor=factor, exact_cache=False)
            rows = [{**r, "factor": factor} for r in measure(lengths)]
            unpatch_model(model)
        else:
            for length in lengths:
                factor = length / train_len
                patch_model(model, method, factor=factor)
                rows += [{**r, "factor": factor} for r in measure([length])]
                unpatch_model(model)
        for row in rows:
            row["multiple"] = row["length"] // train_len
        results[method] = rows
        show(method, rows)
    trained = {"rope": train_info}
    for position in scratch:
        cached[position] = is_cached(dataclasses.replace(config.model, position=position), cache_dir)
        model, _, trained[position] = pretrain(
            dataclasses.replace(config.model, position=position), cache_dir, progress=progress
        )
        name = f"{position} (from scratch)"
        results[name] = [{**r, "factor": 1.0, "multiple": r["length"] // train_len} for r in measure(lengths)]
        show(name, results[name])

    table = markdown_table(header, [[name] + [r["perplexity"] for r in rows] for name, rows in results.items()])
    report = {
        "table": table,
        "results": results,
        "protocol": {
            "metric": f"perplexity (per byte) of the same last {n_scored} bytes of each document, "
            "read with L tokens of context",
            "documents": len(docs),
            "static_factor": "s = L / L_train at each length",
            "dynamic_factor": float(max(config.multiples)),
            "dynamic_forward": "exact_cache=False: every position of a cut uses s(L) (one forward, as the YaRN repo)",
        },
        "train": trained,
        "cached": cached,
        "config": dataclasses.asdict(config),
        "environment": environment(),
        "seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "threads": torch.get_num_threads(),
    }
    if out_dir is not None:
        out = Path(out_dir)
        write_json(out / "demo.json", report)
        write_csv(out / "demo.csv", [{"method": name, **r} for name, rows in results.items() for r in rows])
        write_text(out / "demo.md", table + "\n")
        plot_curves(
            out / "demo.png",
            {name: ([r["length"] for r in rows], [r["perplexity"] for r in rows]) for name, rows in results.items()},
            title=f"tiny Llama trained at {train_len} tokens, extended without fine-tuning",
            vline=train_len,
        )
    return report
