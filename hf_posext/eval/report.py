"""Result files: JSON, CSV, markdown tables, PNG plots, and the environment they were made in.

matplotlib is optional (``pip install hf-posext[plot]``); without it the plots are skipped
with a warning and every other file is still written.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from ..files import atomic_file, write_text

logger = logging.getLogger("hf_posext")


def environment() -> dict[str, Any]:
    """Hardware and versions, recorded next to every result."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write ``payload`` as indented JSON (atomically: a crash never leaves half a file)."""
    return write_text(path, json.dumps(payload, indent=2, default=str) + "\n")


def _differences(before: Any, now: Mapping[str, Any]) -> str:
    """``"factor 2.0 -> 4.0, another model"``: what changed between two settings dicts."""
    before = before if isinstance(before, dict) else {}
    changed = []
    for key in sorted(set(before) | set(now), key=lambda k: (k != "model_content", k)):
        if before.get(key) != now.get(key):
            changed.append("another model" if key == "model_content" else f"{key} {before.get(key)} -> {now.get(key)}")
    return ", ".join(changed) or "unreadable settings"


class ResultFile:
    """A JSON file of named results, saved as each one comes and reused by a rerun with the same settings.

    ``{"settings", "results", "environment", "seconds"}``: an interrupted evaluation or experiment
    resumes where it stopped. Results of other settings (another model, factor, sample count) are
    owned results: replaced only with ``overwrite``, refused otherwise (docs/guides/files_and_safety.md).

        results = ResultFile(out / "ppl.json", settings)
        row = results.get("yarn/truncated", lambda: measure("yarn"))   # computed once, then read

    Args:
        path: the JSON file.
        settings: everything the results depend on (JSON-serialisable; compared after a round trip).
        overwrite: start afresh when the file holds results of other settings (they are named in a warning).

    Raises:
        ValueError: the file holds results of other settings and ``overwrite`` is not set, naming the
            settings that differ; nothing is written.
    """

    def __init__(self, path: str | os.PathLike, settings: Mapping[str, Any], *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings, default=str))
        previous = json.loads(self.path.read_text()) if self.path.exists() else {}
        if not isinstance(previous, dict):
            raise ValueError(
                f"{str(self.path)!r} is not a results file of hf-posext (a JSON object); "
                "move it away or choose another --out"
            )
        same = previous.get("settings") == self.settings
        if not same and previous.get("results"):
            differ = _differences(previous.get("settings"), self.settings)
            if not overwrite:
                raise ValueError(
                    f"{str(self.path)!r} holds {len(previous['results'])} results of other settings "
                    f"({differ}); pass --overwrite (overwrite=True) to replace them, or choose another "
                    "--out (nothing was written)"
                )
            logger.warning(
                "%s: replacing %d results of other settings (%s)", self.path, len(previous["results"]), differ
            )
        self.results: dict[str, Any] = previous.get("results", {}) if same else {}
        self.seconds: float = previous.get("seconds", 0.0) if same and self.results else 0.0
        self._start = time.perf_counter()

    def __contains__(self, key: str) -> bool:
        return key in self.results

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        """The result ``key``: from the file when present, else ``compute()``, saved at once."""
        if key not in self.results:
            self.results[key] = compute()
            self.save()
        return self.results[key]

    def save(self) -> Path:
        return write_json(
            self.path,
            {
                "settings": self.settings,
                "results": self.results,
                "environment": environment(),
                "seconds": round(self.seconds + time.perf_counter() - self._start, 1),
            },
        )


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write dict rows as CSV, columns in first-seen order."""
    path = Path(path)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with atomic_file(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def format_value(value: float | None, digits: int = 3) -> str:
    """A table cell: 3 significant digits, ``-`` for missing, ``inf`` for overflow."""
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    return f"{value:.{digits}g}" if value < 10**digits else f"{value:.0f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; numbers formatted by `format_value`."""
    cells = [[format_value(c) if isinstance(c, float) or c is None else str(c) for c in row] for row in rows]
    widths = [max([len(str(h)), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]  # rows may be none
    lines = ["| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |"
        for row in cells
    ]
    return "\n".join(lines)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed; skipping the plot (pip install hf-posext[plot])", stacklevel=3)
        return None
    return plt


def _save(plt: Any, fig: Any, path: str | os.PathLike, **savefig: Any) -> Path:
    """Write ``fig`` to ``path`` as a 120-dpi PNG, atomically, and close it."""
    path = Path(path)
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png", **savefig)
    plt.close(fig)
    return path


def plot_curves(
    path: str | os.PathLike,
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str = "context length (tokens)",
    ylabel: str = "perplexity",
    vline: float | None = None,
    logy: bool = True,
) -> Path | None:
    """One line per name (``{name: (xs, ys)}``), log2 x axis; ``vline`` marks the training length.

    Returns:
        The PNG's path, or ``None`` when matplotlib is missing.
    """
    if (plt := _pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if vline is not None:
        ax.axvline(vline, color="grey", linestyle="--", linewidth=1, label="training length")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_heatmaps(
    path: str | os.PathLike,
    grids: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[Sequence[float]]]],
    *,
    title: str,
) -> Path | None:
    """Passkey accuracy heat-maps, one panel per name: ``{name: (lengths, depths, acc[depth][length])}``.

    Returns:
        The PNG's path, or ``None`` when matplotlib is missing.
    """
    if (plt := _pyplot()) is None:
        return None
    fig, axes = plt.subplots(1, len(grids), figsize=(1.2 + 3.6 * len(grids), 3.6), squeeze=False)
    image = None
    for ax, (name, (lengths, depths, acc)) in zip(axes[0], grids.items()):
        image = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
        ax.set(title=name, xlabel="prompt length (tokens)", ylabel="key depth")
        for i, row in enumerate(acc):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize=7)
    fig.suptitle(title)
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    return _save(plt, fig, path, bbox_inches="tight")


def plot_grid(
    path: str | os.PathLike,
    grids: Mapping[str, tuple[Sequence[str], Sequence[str], Sequence[Sequence[float]]]],
    *,
    title: str,
    xlabel: str = "context length (tokens)",
    ylabel: str = "",
    colours: Sequence[str] = ("#F0496E", "#EBB839", "#0CD79F"),
    counts: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> Path | None:
    """Score grids in [0, 1], one panel per name: ``{name: (column labels, row labels, values[row][col])}``.

    ``nan`` cells (nothing measured) are left grey; the colour map runs through ``colours``
    (default: the needle-in-a-haystack heat-map's red, yellow, green). ``counts`` (same shape,
    per name) adds each cell's sample count under its value.

    Returns:
        The PNG's path, or ``None`` when matplotlib is missing.
    """
    if (plt := _pyplot()) is None:
        return None
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("score", list(colours)).with_extremes(bad="#DDDDDD")
    rows = max(len(r) for _, r, _ in grids.values())
    fig, axes = plt.subplots(1, len(grids), figsize=(2.0 + 3.2 * len(grids), 1.6 + 0.35 * rows), squeeze=False)
    image = None
    for k, (ax, (name, (columns, row_labels, values))) in enumerate(zip(axes[0], grids.items())):
        image = ax.imshow(values, vmin=0, vmax=1, cmap=cmap, aspect="auto", origin="upper")
        ax.set_xticks(range(len(columns)), list(columns), rotation=45)
        # Panels share their rows: only the first one is labelled, so the labels do not run into the panel before.
        ax.set_yticks(range(len(row_labels)), list(row_labels) if k == 0 else [])
        ax.set(title=name, xlabel=xlabel, ylabel=ylabel if k == 0 else "")
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    label = f"{value:.0%}" + (f"\nn={counts[name][i][j]}" if counts and name in counts else "")
                    ax.text(j, i, label, ha="center", va="center", fontsize=7)
    fig.suptitle(title, y=1.04)
    fig.colorbar(image, ax=axes[0].tolist(), label="score")
    return _save(plt, fig, path, bbox_inches="tight")
