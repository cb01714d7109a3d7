"""The short-to-long window schedule: the training window grows with the optimizer step (SkyLadder).

SkyLadder (Zhu et al. 2025, arXiv 2503.15450, sec. 3) trains short context windows first and grows
them to the full length; LongRecipe (arXiv 2409.00509) trains windows of a fraction of the target.
Here the window is the tokens of a long micro-batch (the PoSE window, or the sequence when PoSE is
off), a function of the optimizer step alone: every micro-batch and every process of a step has
the same one, and a resumed run has the uninterrupted run's (docs/guides/finetune.md).
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``none``: the full window from step 1; ``linear``: one more share per step; ``step``: doubling stages.
SCHEDULES = ("none", "linear", "step")


@dataclass(frozen=True)
class WindowSchedule:
    """The window of each optimizer step: ``start`` tokens at step 0 growing to ``full`` at ``ramp_steps``.

    Args:
        kind: one of `SCHEDULES`. ``linear``: ``start + (full - start) * step / ramp_steps``;
            ``step``: ``start``, ``2 start``, ``4 start``... (each stage an equal share of the ramp), the
            last doubling capped at ``full``; from ``ramp_steps`` on, ``full``.
        start: the first step's window.
        full: the window the run was planned for (``Plan.window``).
        ramp_steps: optimizer steps over which the window grows.
        multiple: every window is a multiple of it (context parallelism splits a sequence in
            ``2 x cp_size`` pieces), rounded down, never below ``start``.

    Raises:
        ValueError: naming the value and what is allowed.
    """

    kind: str
    start: int
    full: int
    ramp_steps: int
    multiple: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"window_schedule must be one of {', '.join(SCHEDULES)}; got {self.kind!r}")
        if not 1 <= self.start <= self.full:
            raise ValueError(
                f"window_start={self.start} exceeds the full window of {self.full} tokens; "
                f"use window_start <= {self.full} (the window grows from it to the full one)"
            )
        if self.ramp_steps < 1:
            raise ValueError(f"window_ramp_steps must be an integer >= 1, got {self.ramp_steps!r}")
        for name, value in (("window_start", self.start), ("the full window", self.full)):
            if value % self.multiple:
                raise ValueError(
                    f"{name} ({value} tokens) is not a multiple of {self.multiple}: context parallelism splits "
                    f"every sequence in {self.multiple} pieces"
                )

    def window(self, step: int) -> int:
        """Tokens of the long micro-batches of optimizer step ``step`` (0-based: the first step is 0)."""
        if self.kind == "none" or step >= self.ramp_steps:
            return self.full
        if self.kind == "linear":
            length = self.start + (self.full - self.start) * step // self.ramp_steps
        else:
            stage = step * self.doublings // self.ramp_steps
            length = min(self.start << stage, self.full)
        return max(self.start, length - length % self.multiple)

    @property
    def doublings(self) -> int:
        """Stages of the ``step`` schedule before the full window: ``ceil(log2(full / start))``."""
        return (-(-self.full // self.start) - 1).bit_length()  # the least k with start * 2^k >= full

    def windows(self) -> list[int]:
        """The distinct windows of the run, shortest first (they only grow): for checks before training."""
        return sorted({self.window(step) for step in range(self.ramp_steps + 1)})

    def describe(self) -> str:
        """One line for the model card and the logs, e.g. ``linear from 1024 to 4096 tokens over 200 steps``."""
        if self.kind == "none":
            return f"{self.full} tokens from step 1"
        return f"{self.kind} from {self.start} to {self.full} tokens over {self.ramp_steps} steps"
