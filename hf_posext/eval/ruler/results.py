"""Turn RULER cells into what ``hf-posext eval ruler`` writes: summary, CSV rows, tables and plots.

Cells are keyed ``"method/task/length"`` (the CLI's result file). The NIAH heat-map bins every
NIAH sample by its needle depth; the task table shows each cell's accuracy with its Wilson
interval and sample count.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..report import markdown_table, plot_grid
from .score import RULER_THRESHOLD, effective_length, summary
from .tasks import TASKS

#: gkamradt's and RULER's heat-map colours: red (0), yellow, green (1).
HEATMAP_COLOURS = ("#F0496E", "#EBB839", "#0CD79F")
#: Depth bins of the NIAH heat-map (edges in [0, 1]).
DEPTH_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def cell(results: Mapping[str, Any], method: str, task: str, length: int) -> dict[str, Any] | None:
    return results.get(f"{method}/{task}/{length}")


def summarise(
    results: Mapping[str, Any],
    methods: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
    *,
    trained_length: int | None,
    relative: float = 0.9,
    threshold: float = RULER_THRESHOLD,
) -> dict[str, Any]:
    """Per method: the average over tasks at each length (pooled samples, Wilson bounds) and effective lengths.

    The relative effective length uses ``relative`` x the reference score: ``none``'s average (the
    method's own without ``none``) at the longest tested length within ``trained_length``.
    """
    lengths = sorted(lengths)
    out: dict[str, Any] = {}
    for method in methods:
        averages: dict[str, Any] = {}
        for length in lengths:
            cells = [cell(results, method, t, length) for t in tasks]
            if all(c is not None for c in cells):
                averages[str(length)] = summary([s["score"] for c in cells for s in c["samples"]])
        out[method] = {"average": averages}
    within = [n for n in lengths if trained_length is None or n <= trained_length]
    for method in methods:
        series = [out[method]["average"].get(str(n), {}).get("accuracy") for n in lengths]
        reference_method = "none" if "none" in out else method
        reference = out[reference_method]["average"].get(str(within[-1]), {}).get("accuracy") if within else None
        rel_threshold = None if reference is None else round(relative * reference, 2)
        out[method]["effective_length"] = {
            "threshold": threshold,
            "length": effective_length(lengths, series, threshold),
        }
        out[method]["relative_effective_length"] = {
            "reference": f"{reference_method} at {within[-1]}" if within else None,
            "reference_score": reference,
            "ratio": relative,
            "threshold": rel_threshold,
            "length": None if rel_threshold is None else effective_length(lengths, series, rel_threshold),
        }
    return out


def csv_rows(
    results: Mapping[str, Any],
    summary_: Mapping[str, Any],
    methods: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
) -> list[dict[str, Any]]:
    """One row per method, task (and ``average``) and length: accuracy, n, Wilson bounds (in %)."""
    rows = []
    for method in methods:
        for task in tasks:
            for length in lengths:
                c = cell(results, method, task, length)
                if c is not None:
                    rows.append(
                        {
                            "method": method,
                            "task": task,
                            "length": length,
                            "accuracy": c["accuracy"],
                            "n": c["n"],
                            "low": c["low"],
                            "high": c["high"],
                            "prompt_tokens": c["prompt_tokens"],
                            "seconds": c["seconds"],
                        }
                    )
        for length in lengths:
            a = summary_[method]["average"].get(str(length))
            if a is not None:
                rows.append({"method": method, "task": "average", "length": length, **a})
    return rows


def _entry(c: Mapping[str, Any] | None) -> str:
    return "-" if c is None else f"{c['accuracy']:.0f} [{c['low']:.0f}, {c['high']:.0f}] n={c['n']}"


def task_table(
    results: Mapping[str, Any],
    summary_: Mapping[str, Any],
    methods: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
) -> str:
    """A markdown table: rows method/task, columns lengths, cells ``accuracy [low, high] n=``, in %."""
    lengths = sorted(lengths)
    rows = []
    for method in methods:
        rows += [[f"{method}/{t}", *[_entry(cell(results, method, t, n)) for n in lengths]] for t in tasks]
        rows.append([f"{method}/**average**", *[_entry(summary_[method]["average"].get(str(n))) for n in lengths]])
    lines = [markdown_table(["method/task", *map(str, lengths)], rows), ""]
    for method in methods:
        e, r = summary_[method]["effective_length"], summary_[method]["relative_effective_length"]
        relative = (
            "relative: no reference within the trained length"
            if r["threshold"] is None
            else f"relative (> {r['ratio']} x {r['reference_score']}, {r['reference']}): "
            f"{_reached(r['length'], r['threshold'], lengths)}"
        )
        lines.append(
            f"- {method}: effective length (> {e['threshold']}): {_reached(e['length'], e['threshold'], lengths)}"
            f"; {relative}"
        )
    return "\n".join(lines)


def _reached(length: int | None, threshold: float, lengths: Sequence[int]) -> str:
    """An effective length in words: the length, or that even the shortest one is not above ``threshold``."""
    return str(length) if length is not None else f"none (not above {threshold:g} at {min(lengths)})"


def niah_grid(
    results: Mapping[str, Any], method: str, lengths: Sequence[int]
) -> tuple[list[list[float]], list[list[int]]]:
    """``[depth bin][length]`` mean score of the method's NIAH samples (``nan`` where none), and their counts."""
    lengths = sorted(lengths)
    grid = [[math.nan] * len(lengths) for _ in DEPTH_BINS[:-1]]
    counts = [[0] * len(lengths) for _ in DEPTH_BINS[:-1]]
    for j, length in enumerate(lengths):
        scores: list[list[float]] = [[] for _ in DEPTH_BINS[:-1]]
        for task, spec in TASKS.items():
            c = cell(results, method, task, length)
            if spec.group != "niah" or c is None:
                continue
            for s in c["samples"]:
                b = min(len(scores) - 1, int(s["depth"] * (len(DEPTH_BINS) - 1)))
                scores[b].append(s["score"])
        for i, values in enumerate(scores):
            counts[i][j] = len(values)
            if values:
                grid[i][j] = sum(values) / len(values)
    return grid, counts


def plot_results(
    out: str | os.PathLike,
    results: Mapping[str, Any],
    methods: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
    title: str,
) -> list[Path]:
    """``ruler_niah.png`` (depth x length per method; when NIAH tasks ran) and ``ruler_tasks.png`` (task x length)."""
    lengths = sorted(lengths)
    written = []
    labels = [f"{int(100 * a)}-{int(100 * b)}%" for a, b in itertools.pairwise(DEPTH_BINS)]
    if any(TASKS[t].group == "niah" for t in tasks):
        grids = {m: niah_grid(results, m, lengths) for m in methods}
        path = plot_grid(
            Path(out) / "ruler_niah.png",
            {m: ([str(n) for n in lengths], labels, grid) for m, (grid, _) in grids.items()},
            title=f"{title}: needle retrieval by depth",
            ylabel="needle depth",
            colours=HEATMAP_COLOURS,
            counts={m: c for m, (_, c) in grids.items()},
        )
        written += [path] if path else []
    table = {}
    for m in methods:
        table[m] = (
            [str(n) for n in lengths],
            list(tasks),
            [[(c["accuracy"] / 100 if (c := cell(results, m, t, n)) else math.nan) for n in lengths] for t in tasks],
        )
    path = plot_grid(
        Path(out) / "ruler_tasks.png", table, title=f"{title}: accuracy by task", ylabel="task", colours=HEATMAP_COLOURS
    )
    written += [path] if path else []
    return written


__all__ = ["DEPTH_BINS", "HEATMAP_COLOURS", "csv_rows", "niah_grid", "plot_results", "summarise", "task_table"]
