"""The one result schema of every benchmark: one row per measurement, read and written here.

A row (:class:`Row`) is ``benchmark, method, setting, metric, value, unit, device, versions, time``
plus ``extra`` (Liger-Kernel's ``all_benchmark_data.csv`` has the same columns, less ``extra``):

* ``benchmark``: the measurement's family, e.g. ``patch_overhead`` or ``alibi_kernels``;
* ``method``: what is compared: a method (``yarn``), an attention path, a training loop (``recipe``);
* ``setting``: everything else the measurement depends on (``{"length": 2048, "threads": 1}``);
* ``metric``, ``value``, ``unit``: what was measured (``ratio``, 1.03, ``x``). ``value`` is a number,
  a bool, a string or ``null``; a measurement that did not run is a ``status`` row whose value is
  ``skip`` or ``FAIL``, with ``extra["reason"]`` or ``extra["error"]``;
* ``device``, ``versions``, ``time``: the CPU or GPU model, the package versions (and the commit),
  and when it was measured (ISO 8601, UTC);
* ``extra``: what a benchmark keeps beside the number (its raw repeats, a search's history, the
  command); never part of a row's identity.

A file of results is a JSON list of rows, one row a line. :func:`write_rows` merges rows into one
atomically: a new row replaces the row of the same identity (benchmark, method, setting, metric)
in place, and ``replace`` drops the rows a rerun owns; every other row is kept. Only the standard
library is imported (``harness.py``'s children measure their own imports); ``scripts/tables.py``
renders every table from these rows.

The resumable real-model evaluations (``real_model.py``'s ``Cells``: ``real_model/``,
``training_free/``, ``finetune_smollm2/`` ...) write a cell cache, ``{"settings", "cells", "runs",
"environment"}``, one cell per computation keyed ``<kind>/<row>[/<length>[/<depth>]]``: their resume
protocol, which runs of hours write. :func:`read_rows` reads such a file as rows too, migrating it on
read (:func:`rows_from_cells`): one row per cell, so that one renderer makes every table.

    rows = read_rows("benchmarks/results/patch_overhead.json")
    write_rows(path, [Row("demo", "yarn", {"length": 64}, "ratio", 1.0, "x", "cpu", {}, "2026-01-01T00:00:00+00:00")])
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: The fields of a row, in the order a file writes them.
FIELDS = ("benchmark", "method", "setting", "metric", "value", "unit", "device", "versions", "time", "extra")
Value = float | int | bool | str | None


@dataclasses.dataclass(frozen=True)
class Row:
    """One measurement. Raises ``ValueError`` naming the field when a field has the wrong type."""

    benchmark: str
    method: str
    setting: dict[str, Any]
    metric: str
    value: Value
    unit: str
    device: str
    versions: dict[str, str]
    time: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("benchmark", "method", "metric"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"a row's {name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("unit", "device", "time"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"a row's {name} must be a string, got {getattr(self, name)!r}")
        for name in ("setting", "versions", "extra"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"a row's {name} must be a JSON object, got {getattr(self, name)!r}")
        if not (self.value is None or isinstance(self.value, (int, float, bool, str))):
            raise ValueError(
                f"a row's value must be a number, a bool, a string or null, got {self.value!r} "
                f"({self.benchmark}/{self.method}/{self.metric}); keep structured detail in extra"
            )
        try:
            plain = self.setting == json.loads(json.dumps(self.setting))
        except (TypeError, ValueError):
            plain = False
        if not plain:
            raise ValueError(
                f"a row's setting must hold JSON values only (no tuples, no objects), got {self.setting!r}"
            )
        try:
            aware = datetime.fromisoformat(self.time).tzinfo is not None
        except ValueError:
            aware = False
        if not aware:
            raise ValueError(
                f"a row's time must be ISO 8601 with its offset (2026-01-31T12:00:00+00:00), got {self.time!r}"
            )

    def get(self, name: str) -> Any:
        """The field ``name``, else the setting ``name``, else ``None``."""
        return getattr(self, name) if name in FIELDS else self.setting.get(name)

    def matches(self, **wanted: Any) -> bool:
        """Whether every ``name=value`` holds (:meth:`get`; ``None`` matches an absent setting)."""
        return all(self.get(name) == value for name, value in wanted.items())

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What a new measurement replaces: benchmark, method, setting (canonical JSON) and metric."""
        return self.benchmark, self.method, json.dumps(self.setting, sort_keys=True), self.metric

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}


def row_from_dict(data: Mapping[str, Any]) -> Row:
    """A :class:`Row` from its JSON object; ``ValueError`` names missing or unknown fields."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a row must be a JSON object, got {data!r}")
    missing = [f for f in FIELDS if f not in data and f != "extra"]
    unknown = [k for k in data if k not in FIELDS]
    if missing or unknown:
        raise ValueError(
            f"a row needs the fields {', '.join(FIELDS)}; missing {missing}, unknown {unknown}: {dict(data)}"
        )
    return Row(**data)


def read_rows(path: str | os.PathLike) -> list[Row]:
    """The rows of a results file: a JSON list of rows, or a cell cache migrated on read (:func:`rows_from_cells`).

    A cell cache's benchmark is its folder's name (``training_free/results.json``: ``training_free``),
    with the file's stem unless it is ``results`` (``finetune_smollm2/llamacpp.json``:
    ``finetune_smollm2/llamacpp``).

    Raises:
        ValueError: the file is neither (naming the file and the bad row).
    """
    path = Path(path)
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get("cells"), dict):
        benchmark = path.parent.name + ("" if path.stem == "results" else f"/{path.stem}")
        try:
            return rows_from_cells(data, benchmark)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{str(path)!r}: {error}") from None
    if not isinstance(data, list):
        raise ValueError(
            f"{str(path)!r} is not a benchmark results file (a JSON list of rows, benchmarks/result_schema.py, "
            'or a cells file: {"settings", "cells", ...}, benchmarks/real_model.py Cells)'
        )
    try:
        return [row_from_dict(item) for item in data]
    except (ValueError, TypeError) as error:
        raise ValueError(f"{str(path)!r}: {error}") from None


#: A cell cache keeps no time per cell: its rows take the last run's start, else this.
UNKNOWN_TIME = "1970-01-01T00:00:00+00:00"


def rows_from_cells(content: Mapping[str, Any], benchmark: str) -> list[Row]:
    """The rows of a cell cache's content (``real_model.Cells``' file), one per cell, in the file's order.

    A cell ``<kind>/<row>/<length>/<depth>`` is the row ``metric=kind, method=row`` whose setting is
    the file's scalar settings with ``length`` (an int) and ``depth`` (a float); a key of one part
    (``timing``) is its own method. The value is the cell's scalar value, or its headline when it is
    an object (a perplexity point's ``perplexity``, a one-length passkey result's accuracy, else
    ``None``); ``extra`` keeps the cell's key, its seconds and its object value. Device and versions
    are the file's ``environment``; the time is the last run's start if it is in UTC (the cache keeps
    none per cell), else :data:`UNKNOWN_TIME`.

    Raises:
        ValueError: a cell is not ``{"seconds", "value"}`` (naming its key).
    """
    settings = {k: v for k, v in content.get("settings", {}).items() if isinstance(v, (str, int, float, bool))}
    environment = content.get("environment") or {}
    device = str(environment.get("cuda") or environment.get("cpu") or "unknown")
    versions = {k: str(environment[k]) for k in ("python", "torch", "transformers") if environment.get(k)}
    runs = content.get("runs") or []
    started = str(runs[-1].get("started", "")) if runs else ""
    time = UNKNOWN_TIME
    if started.endswith(" UTC"):  # time.strftime("%Y-%m-%d %H:%M:%S %Z") on a machine in UTC
        time = datetime.strptime(started[:-4], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).isoformat()
    rows = []
    for key, cell in content["cells"].items():
        if not isinstance(cell, Mapping) or "value" not in cell:
            raise ValueError(f"the cell {key!r} must be {{'seconds': ..., 'value': ...}}, got {cell!r}")
        parts = key.split("/")
        setting = dict(settings)
        if len(parts) > 2:
            setting["length"] = int(parts[2])
        if len(parts) > 3:
            setting["depth"] = float(parts[3])
        extra = {"key": key, "seconds": cell.get("seconds")}
        value = cell["value"]
        if isinstance(value, (dict, list)):
            extra["value"], value = value, _headline(value)
        method = parts[1] if len(parts) > 1 else parts[0]
        rows.append(Row(benchmark, method, setting, parts[0], value, "", device, versions, time, extra))
    return rows


def _headline(value: Any) -> Value:
    """The number an object-valued cell stands for: its perplexity, or its accuracy at its one length."""
    if isinstance(value, dict) and "perplexity" in value:
        return value["perplexity"]
    if isinstance(value, dict) and len(value.get("accuracy_by_length") or ()) == 1:
        return value["accuracy_by_length"][0]
    return None


def dumps(rows: Iterable[Row]) -> str:
    """A results file's text: a JSON list, one row a line (so that a rerun's diff shows the rows it changed)."""
    lines = [json.dumps(row.to_dict(), default=str) for row in rows]
    return "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[]\n"


def merge(old: Iterable[Row], new: Iterable[Row], replace: Callable[[Row], bool] | None = None) -> list[Row]:
    """``old`` less the rows ``replace`` accepts, each row of ``new`` in the place of the row of its identity.

    Rows of ``new`` with no such row go at the end, in order; a later row of ``new`` replaces an
    earlier one of the same identity.
    """
    fresh: dict[tuple, Row] = {}
    for row in new:
        fresh[row.identity] = row
    merged, placed = [], set()
    for row in old:
        if row.identity in fresh and row.identity not in placed:
            merged.append(fresh[row.identity])
            placed.add(row.identity)
        elif row.identity not in fresh and not (replace and replace(row)):
            merged.append(row)
    return merged + [row for key, row in fresh.items() if key not in placed]


def write_rows(path: str | os.PathLike, rows: Iterable[Row], *, replace: Callable[[Row], bool] | None = None) -> Path:
    """Merge ``rows`` into the results file at ``path`` (:func:`merge`), atomically; returns the path."""
    # hf_posext.files imports torch through the package: imported here, at write time, not at import time.
    from hf_posext.files import write_text

    path = Path(path)
    old = read_rows(path) if path.is_file() else []
    return write_text(path, dumps(merge(old, rows, replace)))


def latest(rows: Iterable[Row]) -> Row | None:
    """The most recently measured of ``rows`` (the last written among equal times), or ``None``."""
    best = None
    for row in rows:
        if best is None or datetime.fromisoformat(row.time) >= datetime.fromisoformat(best.time):
            best = row
    return best


def unit_of(metric: str) -> str:
    """The unit a metric's name implies, by the naming convention of every benchmark here.

    ``*tokens_per_s``, ``*tokens_per_cpu_s`` tokens/s; ``*tflops*`` TFLOP/s; ``*per_minute`` per minute;
    ``*_ms`` ms; ``*_s``, ``seconds*`` s; ``*_mib`` MiB; ``*_gib`` GiB; ``*ratio*``, ``*_vs_*``, ``speedup*``
    x (a ratio); anything else ``""`` (a count, a perplexity, a loss, an error, a flag).
    """
    if metric.endswith(("tokens_per_s", "tokens_per_cpu_s")):
        return "tokens/s"
    if "tflops" in metric:
        return "TFLOP/s"
    if metric.endswith("per_minute"):
        return "per minute"
    if metric.endswith("_ms"):
        return "ms"
    if metric.endswith("_s") or metric.startswith("seconds"):
        return "s"
    if metric.endswith("_mib"):
        return "MiB"
    if metric.endswith("_gib"):
        return "GiB"
    if "ratio" in metric or "_vs_" in metric or metric.startswith("speedup"):
        return "x"
    return ""
