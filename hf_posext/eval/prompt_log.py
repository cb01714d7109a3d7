"""The finished prompts of a result still being computed, kept on disk as each one finishes.

A `hf_posext.eval.report.ResultFile` saves a result once it is complete (a passkey grid of one
method); the prompts of a result cut short (Ctrl-C, a kill, a lost machine) would be lost with it, minutes of
generation each at 10k tokens. `PromptLog` appends one JSON line per finished prompt, flushed and
synced before the next prompt starts, so a rerun with the same settings asks only the prompts not yet done:

    log = PromptLog(out / "passkey.prompts.jsonl", settings)
    result = passkey_accuracy(..., finished=log.finished("yarn"), on_prompt=lambda i, s: log.add("yarn", i, s))
    log.forget("yarn")   # once the whole result is saved in the result file
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..files import write_text


def _parse(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None  # the last line of a process killed while writing it


class PromptLog:
    """Append-only JSON lines: a header with the settings, then ``{"key", "index", "value"}`` per finished prompt.

    Lines of other settings (another model, other lengths) are dropped when the first prompt of these
    settings is written: the file only ever holds prompts of the settings in its header.

    Args:
        path: the ``.jsonl`` file (created on the first finished prompt).
        settings: everything the prompts depend on, as the result file's (compared after a JSON round trip).
    """

    def __init__(self, path: str | os.PathLike, settings: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings, default=str))
        self._done: dict[str, dict[int, Any]] = {}
        text = self.path.read_text() if self.path.is_file() else ""
        lines = text.splitlines()
        header = _parse(lines[0]) if lines else None
        self._clean = False  # whether the file may be appended to as it is
        if isinstance(header, dict) and header.get("settings") == self.settings:
            for entry in map(_parse, lines[1:]):
                if isinstance(entry, dict) and isinstance(entry.get("index"), int) and "value" in entry:
                    self._done.setdefault(str(entry.get("key")), {})[entry["index"]] = entry["value"]
            self._clean = text.endswith("\n") and all(_parse(line) is not None for line in lines)

    def finished(self, key: str) -> dict[int, Any]:
        """``{prompt index: value}`` of the prompts of result ``key`` finished by earlier runs."""
        return dict(self._done.get(key, {}))

    def add(self, key: str, index: int, value: Any) -> None:
        """Keep prompt ``index`` of result ``key``: on disk (flushed and synced) before this returns."""
        self._done.setdefault(key, {})[index] = value
        if not self._clean:  # other settings' prompts, or a line cut short by a kill: rewrite, then append
            self._rewrite()
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps({"key": key, "index": index, "value": value}, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def forget(self, key: str) -> None:
        """Drop result ``key``'s prompts (the result file now holds the whole result); the file goes with the last."""
        if self._done.pop(key, None) is None:
            return
        if self._done:
            self._rewrite()
        else:
            self.path.unlink(missing_ok=True)

    def under(self, prefix: str) -> _Prefixed:
        """This log with every key read as ``prefix/key`` (one method's cells: ``ruler_accuracy``'s ``prompts``)."""
        return _Prefixed(self, prefix)

    def _rewrite(self) -> None:
        lines = [json.dumps({"settings": self.settings})]
        for key, prompts in self._done.items():
            lines += [json.dumps({"key": key, "index": i, "value": v}, default=str) for i, v in sorted(prompts.items())]
        write_text(self.path, "\n".join(lines) + "\n")  # atomic: the old file or the new, never half of one
        self._clean = True


class _Prefixed:
    """`PromptLog.under`: ``finished``, ``add`` and ``forget`` under ``prefix/key``."""

    def __init__(self, log: PromptLog, prefix: str) -> None:
        self.log, self.prefix = log, prefix

    def finished(self, key: str) -> dict[int, Any]:
        return self.log.finished(f"{self.prefix}/{key}")

    def add(self, key: str, index: int, value: Any) -> None:
        self.log.add(f"{self.prefix}/{key}", index, value)

    def forget(self, key: str) -> None:
        self.log.forget(f"{self.prefix}/{key}")


__all__ = ["PromptLog"]
