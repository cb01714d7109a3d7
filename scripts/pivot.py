"""The one renderer of the docs' benchmark tables: a pivot of result rows (``result_schema.py``) into Markdown.

A :class:`Table` reads one results file; each :class:`Pivot` selects rows, groups them into table
rows by a key (the leading cells) and fills each :class:`Column` with the latest row it matches in
the group, formatted, or with what it computes from the group. ``scripts/tables.py`` declares
every docs table with them; docs/results/benchmark_data.md shows one whole.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts import ROOT

if str(ROOT / "benchmarks") not in sys.path:  # result_schema.py: benchmarks/ is a folder of scripts, not a package
    sys.path.append(str(ROOT / "benchmarks"))
from result_schema import Row, latest, read_rows  # noqa: E402


def table(header: list[str], rows: list[list[Any]], aligned: bool = False) -> str:
    """A Markdown table; ``aligned`` pads every column to its widest cell (the first left, the others right)."""
    if not aligned:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |"
        for row in cells
    ]
    return "\n".join(lines)


def kilo(n: int | str) -> str:
    return f"{int(n) // 1024}k" if int(n) % 1024 == 0 else str(n)


def found_cell(found: Sequence[float]) -> str:
    """``found/asked (low-high)``: per-prompt scores (bools or 0..1) with their 95% Wilson interval; ``-`` if none."""
    from hf_posext.eval.ruler.score import wilson_interval  # here: importing hf_posext loads torch

    if not found:
        return "-"
    low, high = wilson_interval(sum(found), len(found))
    return f"{sum(found):g}/{len(found)} ({low:.2f}-{high:.2f})"


def found_by_depth(rows: Sequence[Row], method: str, length: int) -> dict[float, bool]:
    """``{depth: found}`` of ``method``'s passkey rows at ``length`` (cells ``passkey/<row>/<length>/<depth>``)."""
    return {
        r.setting["depth"]: bool(r.value) for r in rows if r.matches(metric="passkey", method=method, length=length)
    }


def value(rows: Sequence[Row], **match: Any) -> Any:
    """The value of the latest of ``rows`` that matches (``Row.matches``), or ``None``."""
    row = latest(r for r in rows if r.matches(**match))
    return None if row is None else row.value


def fmt(spec: str, suffix: str = "", scale: float = 1) -> Callable[[Row], str]:
    """A cell formatter: ``format(value * scale, spec) + suffix``."""
    return lambda row: format(row.value * scale, spec) + suffix


@dataclasses.dataclass(frozen=True)
class Column:
    """A column: its header and its cell in each table row.

    The cell is ``show`` of the latest row that ``match`` selects among the table row's rows
    (``missing`` when there is none or its value is ``null``), or ``compute(table row's rows, all rows)``.
    """

    header: str
    match: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    show: Callable[[Row], str] = lambda row: str(row.value)
    compute: Callable[[list[Row], list[Row]], str] | None = None
    missing: str = "-"

    def cell(self, group: list[Row], rows: list[Row]) -> str:
        if self.compute is not None:
            return self.compute(group, rows)
        row = latest(r for r in group if r.matches(**self.match))
        return self.missing if row is None or row.value is None else self.show(row)


@dataclasses.dataclass(frozen=True)
class Pivot:
    """Table rows from result rows: one per distinct ``key(row)`` of the rows ``where`` selects.

    ``key`` gives the leading cells (``None`` leaves a row out); the table rows come in the order
    their keys are first seen, sorted by ``order`` (a function of the first row of each, or the
    leading cells' wanted order: others after them); ``columns`` may depend on the selected rows.
    With ``only_order`` (and ``order`` a sequence) the table rows are exactly those of ``order``,
    one with no result rows showing its columns' empty cells.
    """

    where: Mapping[str, Any] | Callable[[Row], bool]
    key: Callable[[Row], tuple[str, ...] | None]
    columns: Sequence[Column] | Callable[[list[Row]], Sequence[Column]]
    order: Callable[[Row], Any] | Sequence[str] | None = None
    only_order: bool = False

    def select(self, rows: list[Row]) -> list[Row]:
        where = self.where
        return [r for r in rows if (where(r) if callable(where) else r.matches(**where))]

    def columns_for(self, rows: list[Row]) -> Sequence[Column]:
        return self.columns(self.select(rows)) if callable(self.columns) else self.columns

    def body(self, rows: list[Row]) -> list[list[str]]:
        selected = self.select(rows)
        groups: dict[tuple[str, ...], list[Row]] = {}
        for row in selected:
            key = self.key(row)
            if key is not None:
                groups.setdefault(key, []).append(row)
        keys = list(groups)
        if self.only_order and isinstance(self.order, Sequence):
            keys = [(name,) for name in self.order]
        elif isinstance(self.order, Sequence):
            wanted = list(self.order)
            keys.sort(key=lambda k: wanted.index(k[0]) if k[0] in wanted else len(wanted))
        elif self.order is not None:
            keys.sort(key=lambda k: self.order(groups[k][0]))  # type: ignore[operator, misc]
        columns = self.columns_for(rows)
        return [[*key, *(c.cell(groups.get(key, []), selected) for c in columns)] for key in keys]


@dataclasses.dataclass(frozen=True)
class Table:
    """A Markdown table of the rows of ``source`` (a results file under a folder), with text before or after it.

    The header is ``index`` (the leading cells' headers) and the first pivot's column headers; the
    pivots' table rows follow each other; ``before`` and ``after`` read every row of the file. With
    no rows selected it renders as ``None``. ``derive``, if given, makes the rows the pivots read from
    the file's (a cell cache's one computation shown in several table rows: ``tables.real_model_view``).
    """

    source: str
    index: Sequence[str]
    pivots: Sequence[Pivot]
    before: Callable[[list[Row]], str] | None = None
    after: Callable[[list[Row]], str] | None = None
    derive: Callable[[list[Row]], list[Row]] | None = None

    def render(self, folder: Path) -> str | None:
        """The table from ``folder / source``, or ``None`` when the file or its selected rows are not there."""
        path = folder / self.source
        rows = read_rows(path) if path.is_file() else []
        if self.derive is not None:
            rows = self.derive(rows)
        body = [line for pivot in self.pivots for line in pivot.body(rows)]
        if not body:
            return None
        header = [*self.index, *(c.header for c in self.pivots[0].columns_for(rows))]
        text = table(header, body)
        if self.before:
            text = self.before(rows) + text
        if self.after:
            text += self.after(rows)
        return text


def ratio(a: Mapping[str, Any], b: Mapping[str, Any], spec: str = ".2f") -> Callable[[list[Row], list[Row]], str]:
    """A computed cell: the value ``a`` selects over the value ``b`` selects, among the table row's rows."""

    def cell(group: list[Row], rows: list[Row]) -> str:
        top, bottom = value(group, **a), value(group, **b)
        return "-" if top is None or not bottom else format(top / bottom, spec)

    return cell


def reason(status: Row) -> str:
    """Why a measurement did not run or failed (a ``status`` row), on one line of at most 80 characters."""
    text = status.extra.get("reason") or status.extra.get("error") or ""
    return text[:80].replace("|", "/").replace("\n", " ")


def ok_or(
    metric: str, show: Callable[[Row], str], otherwise: Callable[[Row], str] = lambda status: ""
) -> Callable[[list[Row], list[Row]], str]:
    """A computed cell: ``show`` of the ``metric`` row, or ``otherwise`` of a ``status`` row that is not ``ok``."""

    def cell(group: list[Row], rows: list[Row]) -> str:
        status = latest(r for r in group if r.metric == "status")
        if status is not None and status.value != "ok":
            return otherwise(status)
        row = latest(r for r in group if r.metric == metric)
        return "-" if row is None or row.value is None else show(row)

    return cell


def lengths(rows: list[Row], name: str = "length") -> list[int]:
    return sorted({r.setting[name] for r in rows if name in r.setting})
