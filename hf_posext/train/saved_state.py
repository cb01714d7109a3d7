"""Resumable training states, written atomically by every process of a run.

``Accelerator.save_state`` plus the scheduler and `TrainProgress`, staged, marked complete
and renamed into place; `latest_checkpoint` takes the newest state that verifies
(docs/notes/training.md).
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from ..files import MARKER, replace_directory, verify_folder, write_marker

logger = logging.getLogger("hf_posext")

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainProgress:
    """Where a run is: steps, micro-batches consumed (the data position), tokens, losses, eval so far.

    Registered with ``accelerator.register_for_checkpointing`` so it is saved and restored with
    the rest of the training state.
    """

    step: int = 0
    micro_step: int = 0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    eval: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.micro_step = int(state["micro_step"])
        self.tokens = int(state["tokens"])
        self.losses = [float(x) for x in state["losses"]]
        self.eval = {str(k): float(v) for k, v in state.get("eval", {}).items()}


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step_*`` folder, oldest first (complete or not: see `verify_checkpoint`)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def verify_checkpoint(path: str | Path) -> str | None:
    """None when ``path`` is a complete training state, else why it is not."""
    path = Path(path)
    if not path.is_dir() or not _STEP_DIR.match(path.name):
        return "not a training state folder (expected .../step_NNNNNNNN)"
    return verify_folder(path)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest training state in ``checkpoint_dir`` that verifies, or None; newer broken ones are logged."""
    for _, path in reversed(list_checkpoints(checkpoint_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        logger.warning("skipping training state %s: %s", path, problem)
    return None


def _clean_stale(root: Path) -> None:
    """Remove what killed saves left: ``.step_*.tmp`` and ``.step_*.old-*`` (never restored)."""
    for path in root.glob(".step_*"):
        if path.is_dir() and (path.name.endswith(".tmp") or ".old-" in path.name):
            shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(accelerator: Accelerator, checkpoint_dir: str | Path, step: int, keep: int = 0) -> Path:
    """Save the full training state of every process as ``step_<step>``, atomically.

    Must be called by every process at the same step.

    Args:
        accelerator: the run's accelerator (models, optimizers, custom objects registered).
        checkpoint_dir: the folder holding the run's training states.
        step: the optimizer step just completed.
        keep: keep only the newest ``keep`` states after saving (0 keeps all).

    Returns:
        The folder of the new state.
    """
    root = Path(checkpoint_dir)
    final = root / checkpoint_name(step)
    tmp = root / f".{final.name}.tmp"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        _clean_stale(root)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_marker(tmp)  # last into the folder: what every process wrote is on disk now
        # Replaces a state only when a run re-saves a step it already saved (resumed from an older one).
        replace_directory(tmp, final)
        if keep:
            for _, old in list_checkpoints(root)[:-keep]:
                (old / MARKER).unlink(missing_ok=True)  # first: a prune killed half-way is not a state
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, path: str | Path) -> None:
    """Restore a state written by `save_checkpoint` into the prepared objects.

    Raises:
        FileNotFoundError: if ``path`` is not a complete training state (the message says why and
            names the newest state next to it that is).
    """
    path = check_resumable(path)
    accelerator.load_state(str(path))


def check_resumable(path: str | Path) -> Path:
    """``path`` as a Path if it is a complete training state.

    Raises:
        FileNotFoundError: saying why it is not, and naming the newest state next to it that is.
    """
    path = Path(path)
    problem = verify_checkpoint(path)
    if problem is not None:
        good = latest_checkpoint(path.parent) if path.parent.is_dir() else None
        hint = f"; the newest complete state there is {str(good)!r}" if good is not None else ""
        raise FileNotFoundError(f"cannot resume from {str(path)!r}: {problem}{hint}")
    return path


def saved_custom_state(path: str | Path, index: int) -> Any:
    """The state of the ``index``-th object registered for checkpointing, as saved in the state at ``path``.

    Read without loading anything else (accelerate writes each as ``custom_checkpoint_<index>.pkl``),
    so a resume can be checked before a model is built. Plain values only (``weights_only``): this
    never runs code from the file.

    Raises:
        FileNotFoundError: if the state holds no such object, naming the file.
    """
    file = Path(path) / f"custom_checkpoint_{index}.pkl"
    if not file.is_file():
        raise FileNotFoundError(f"cannot resume from {str(path)!r}: it has no {file.name} (not a state of this recipe)")
    return torch.load(file, map_location="cpu", weights_only=True)
