"""What a resumed run must share with the run that saved the state: its settings and its process layout.

Both are checked before any model is built (accelerate loads the weights first, where another
LoRA shape or another sharding would fail with a traceback, or worse load and train on): the
settings that change the result (every field but `RESUME_FREE`), and the processes (how
many, the data-parallel size that the data position counts in, the distributed type the state's
files are written for).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..methods import split_method_kwargs
from .config import TrainConfig
from .old_settings import take_old_settings

#: The settings a resumed run may change, each with why it leaves the result as it is; every other
#: field of `TrainConfig` (a new one included) must match the saved run (`resume_invariants`).
RESUME_FREE = {
    "output_dir": "where the final checkpoint is written",
    "overwrite": "whether an existing output may be replaced",
    "checkpointing_steps": "how often training states are saved (saving draws no random numbers)",
    "checkpoint_dir": "where training states are kept",
    "checkpoints_total_limit": "how many training states are kept",
    "resume": "which training state the run continues from",
    "cache_dir": "where the tokenized data is cached (the data itself is checked by dataset, seq_len...)",
    "report_to": "where metrics are logged",
    "save_dtype": "the dtype the final weights are written in, after training",
    "activation_checkpointing": "recomputes the same activations in the backward: memory, not maths",
    "activation_offload": "where checkpointed activations wait: memory, not maths",
}


def resume_invariants(config_class: type = TrainConfig) -> tuple[str, ...]:
    """Every field of ``config_class`` but `RESUME_FREE`: the settings that change the result."""
    return tuple(field.name for field in dataclasses.fields(config_class) if field.name not in RESUME_FREE)


#: Settings that must not change between a run and its resumption (they change the result).
RESUME_INVARIANTS = resume_invariants()

#: `RunConfig`'s place among the checkpointed objects (its ``custom_checkpoint_<i>.pkl``).
RUN_CONFIG_STATE = 2
#: The key of the process layout in `RunConfig`'s saved state (no setting has this name).
LAYOUT_KEY = "_layout"


def check_resume_config(saved: dict[str, Any], config: TrainConfig) -> None:
    """Refuse a resume whose settings that change the result differ from the saved run's.

    Raises:
        ValueError: naming each changed setting, saved value -> new value.
    """
    saved, current = as_trained(saved), as_trained(config.to_dict())
    changed = [key for key in RESUME_INVARIANTS if key in saved and saved[key] != current[key]]
    if changed:
        details = "; ".join(f"{key}: {saved[key]!r} -> {current[key]!r}" for key in changed)
        longer = (
            changed == ["max_train_steps"]
            and isinstance(saved["max_train_steps"], int)
            and isinstance(current["max_train_steps"], int)
            and current["max_train_steps"] > saved["max_train_steps"]
        )
        hint = (
            f"; a resume cannot train longer: the saved state's learning-rate schedule and data order are sized for "
            f"{saved['max_train_steps']} steps. To train {current['max_train_steps']}, start again without --resume "
            "(into an empty --output-dir and --checkpoint-dir), or resume with the saved --max-train-steps "
            f"{saved['max_train_steps']} to finish the run as planned"
            if longer
            else ""
        )
        raise ValueError(f"cannot resume: settings that change the result differ from the saved run ({details}){hint}")


def as_trained(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (``TrainConfig.to_dict()``, or a run saved by an earlier release) as two runs compare them.

    An old setting (``longrope_factors``) is moved into ``method_kwargs`` as the constructor moves it
    (`hf_posext.train.old_settings`), unwarned; the method's training options are filled in with their
    defaults, so that a run saved before a setting became an option, or one that left an option at its
    default, compares equal to one that spells it out. Settings that cannot be read are compared as they are.
    """
    try:
        settings = take_old_settings(settings, str(TrainConfig.__dataclass_fields__["method"].default), warn=False)
        arguments, options = split_method_kwargs(settings["method"], settings.get("method_kwargs") or {})
    except (KeyError, TypeError, ValueError, AttributeError):
        return settings
    return {**settings, "method_kwargs": {**arguments, **options}}


def process_layout(num_processes: int, dp_size: int, distributed_type: str) -> dict[str, Any]:
    """What a training state is tied to: the processes that wrote it."""
    return {"num_processes": num_processes, "dp_size": dp_size, "distributed_type": distributed_type}


def saved_layout(saved: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The process layout of the state at ``path``; for states saved before it was recorded, the
    process count read from the per-process RNG files accelerate writes (``random_states_<rank>.pkl``)."""
    if LAYOUT_KEY in saved:
        return dict(saved[LAYOUT_KEY])
    return {"num_processes": len(list(Path(path).glob("random_states_*.pkl")))}


def check_resume_layout(saved: dict[str, Any], path: str | Path, current: dict[str, Any]) -> None:
    """Refuse a resume on other processes than the state's.

    A state holds each process's RNG state and, sharded, its part of the weights and optimizer;
    its data position counts micro-batches of its data-parallel size. On other processes the run
    would go on from other blocks (with DDP, silently), so it is refused.

    Raises:
        ValueError: naming the saved and the current layout, and how to resume.
    """
    layout = saved_layout(saved, path)
    changed = [key for key, value in layout.items() if key in current and value != current[key]]
    if changed:
        theirs = ", ".join(f"{key} {layout[key]}" for key in layout)
        ours = ", ".join(f"{key} {current[key]}" for key in layout if key in current)
        raise ValueError(
            f"cannot resume from {str(path)!r} on other processes: it was saved by {theirs}, this run has {ours}; "
            f"its data position, RNG and sharded states are per process: launch {layout['num_processes']} "
            "process(es) with the same accelerate config to continue it"
        )


class RunConfig:
    """The run's settings and process layout, saved with every state; ``setup`` checks them before
    any model is built (accelerate loads weights first: another LoRA shape would fail in
    ``load_state_dict``)."""

    def __init__(self, config: TrainConfig, layout: dict[str, Any]) -> None:
        self.config = config
        self.layout = layout

    def state_dict(self) -> dict[str, Any]:
        return {**self.config.to_dict(), LAYOUT_KEY: self.layout}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: compared with the run's own settings in ``setup``."""
