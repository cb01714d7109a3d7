"""A run's lengths and batch arithmetic, resolved against the patched model before training starts.

`plan_run` is where a setting only the model can judge fails (a ``seq_len`` beyond what the
patched model takes, a PoSE window longer than the sequence, a global batch the processes do not
divide): after the model is loaded, before an optimizer exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from transformers import PreTrainedModel

from ..methods import method_class, training_for
from ..patching import patch_info
from .config import TrainConfig
from .schedule import WindowSchedule


@dataclass(frozen=True)
class Plan:
    """Lengths and batch arithmetic of a run, derived from the config and the patched model."""

    original_context: int
    context: int
    seq_len: int
    window: int
    short_len: int
    accumulation: int
    dp_size: int
    dp_rank: int
    #: the window of each optimizer step (``window`` from step 1 unless ``window_schedule`` is set)
    schedule: WindowSchedule | None = None

    def window_at(self, step: int) -> int:
        """Tokens of the long micro-batches of optimizer step ``step`` (0-based)."""
        return self.window if self.schedule is None else self.schedule.window(step)


def plan_run(config: TrainConfig, model: PreTrainedModel, dp_size: int, dp_rank: int, cp_size: int = 1) -> Plan:
    """Check lengths and batch sizes against the patched ``model``; raise before training.

    Raises:
        ValueError: a sequence the patched model cannot take, a PoSE window longer than the
            sequence, a global batch the processes and micro-batches do not divide, or a window
            schedule the window cannot follow.
    """
    info = patch_info(model)
    original = int(info.get("original_max_position_embeddings") or model.config.max_position_embeddings)
    context = int(info.get("context_length") or model.config.max_position_embeddings)
    seq_len = config.seq_len or context
    spec = method_class(config.method)
    # Methods that replace RoPE (ALiBi, sinusoidal) have no table to outgrow, so fine-tuning them
    # beyond the original context is the point; a learned position table does have a length.
    bounded = spec.scales_rope or "max_length" in {f.name for f in dataclasses.fields(spec)}
    if bounded and seq_len > context:
        raise ValueError(
            f"seq_len={seq_len} exceeds the {context} tokens {config.model!r} takes with {config.method!r} "
            f"at factor {config.factor:g} (original context {original}); use seq_len <= {context} or a larger factor"
        )
    window = seq_len
    if config.pose:
        window = config.pose_window or min(original, seq_len)
        if window > seq_len:
            raise ValueError(f"pose_window={window} exceeds seq_len={seq_len}; PoSE trains a shorter window")
        if config.pose_chunks > window:
            raise ValueError(f"pose_chunks={config.pose_chunks} exceeds the PoSE window of {window} tokens")
    short_len = config.short_seq_len or min(original, window)
    if short_len > seq_len:
        raise ValueError(f"short_seq_len={short_len} exceeds seq_len={seq_len}; short documents are the shorter side")
    per_step = config.micro_batch_size * dp_size
    if config.global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size={config.global_batch_size} is not a multiple of micro_batch_size x data-parallel "
            f"processes = {config.micro_batch_size} x {dp_size}; pick a global batch divisible by {per_step}"
        )
    if cp_size > 1 and window % (2 * cp_size):
        raise ValueError(
            f"context parallelism over {cp_size} devices needs a sequence length divisible by {2 * cp_size} "
            f"(load balancing splits it in 2 x cp_size pieces); got {window}"
        )
    # the method's own limits (LongRoPE's mixed factors: short documents within the original context)
    training_for(config.method).check_lengths(
        config.training_options, original_context=original, short_len=short_len if config.short_fraction else None
    )
    schedule = _schedule(config, window, cp_size)
    accumulation = config.global_batch_size // per_step
    return Plan(original, context, seq_len, window, short_len, accumulation, dp_size, dp_rank, schedule)


def _schedule(config: TrainConfig, window: int, cp_size: int) -> WindowSchedule | None:
    """The window schedule of ``config`` growing to ``window`` (None without one); checked against PoSE's chunks."""
    if config.window_schedule == "none":
        return None
    multiple = 2 * cp_size if cp_size > 1 else 1
    start = config.window_start or max(2, multiple, window // 4 // multiple * multiple)
    ramp = config.window_ramp_steps or max(1, config.max_train_steps // 2)
    schedule = WindowSchedule(config.window_schedule, start, window, ramp, multiple)
    first = schedule.window(0)
    if config.pose and config.pose_chunks > first:
        raise ValueError(
            f"pose_chunks={config.pose_chunks} exceeds the first window of {first} tokens (window_start); "
            f"use window_start >= {config.pose_chunks} or fewer chunks"
        )
    return schedule
