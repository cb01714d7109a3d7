"""Resumable training states, written atomically by every process of a run.

A training state is what ``accelerate.Accelerator.save_state`` writes (model, optimizer, every
process's RNG states, sharded the right way under FSDP and DeepSpeed) plus the objects
registered with ``register_for_checkpointing`` (the LR scheduler and :class:`TrainProgress`,
which holds the data position). It lands in ``<checkpoint_dir>/step_00000040``:

1. the main process creates ``.step_00000040.tmp`` (removing a leftover of a crashed save);
2. every process writes its part into it;
3. the main process renames it into place (:func:`hf_posext.files.replace_directory`), then prunes
   the oldest states.

A crash at any point leaves either the complete folder or none, and :func:`latest_checkpoint`
only ever sees complete ones (temporary folders start with a dot).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from ..files import replace_directory

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
    """``(step, folder)`` of every complete training state, oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete training state in ``checkpoint_dir``, or None."""
    found = list_checkpoints(checkpoint_dir)
    return found[-1][1] if found else None


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
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        # Replaces a state only when a run re-saves a step it already saved (resumed from an older one).
        replace_directory(tmp, final)
        if keep:
            for _, old in list_checkpoints(root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, path: str | Path) -> None:
    """Restore a state written by :func:`save_checkpoint` into the prepared objects.

    Raises:
        FileNotFoundError: if ``path`` is not a complete training state.
    """
    path = Path(path)
    if not path.is_dir() or not _STEP_DIR.match(path.name):
        raise FileNotFoundError(f"{str(path)!r} is not a training state folder (expected .../step_NNNNNNNN)")
    accelerator.load_state(str(path))
