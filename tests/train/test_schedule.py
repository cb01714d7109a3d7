"""The short-to-long window schedule (SkyLadder): the window of each optimizer step, and a run that follows it.

What it promises: the window grows from ``window_start`` to the full window over ``window_ramp_steps``
(linearly, or in doubling stages) and stays full after; it is a function of the optimizer step
alone, so every micro-batch of a step (gradient accumulation, the long/short mix) and every process
has the same one, and a run killed mid-schedule resumes with exactly the uninterrupted run's losses.
"""

from __future__ import annotations

import json

import os
import shutil
import signal
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from hf_posext.train.saved_state import latest_checkpoint
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train
from hf_posext.train.micro_batches import MicroBatches
from hf_posext.train.plan import Plan
from hf_posext.train.schedule import WindowSchedule

from tests.helpers.finetune import record_forward_loss
from tests.train.test_loop import KILL_SCRIPT, ROOT, SUBPROCESS_ENV
from tests.train.test_mix import make_assets, mixed

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("schedule"))


def reference_window(kind: str, start: int, full: int, ramp: int, step: int) -> int:
    """The schedule as its definition reads, with exact fractions and a loop for the stages."""
    if kind == "none" or step >= ramp:
        return full
    if kind == "linear":
        return int(start + Fraction(full - start) * Fraction(step, ramp))
    stages = 0
    while start * 2**stages < full:
        stages += 1
    return min(start * 2 ** int(Fraction(step * stages, ramp)), full)


@pytest.mark.parametrize("kind", ["none", "linear", "step"])
@pytest.mark.parametrize(("start", "full", "ramp"), [(8, 32, 4), (8, 40, 6), (100, 4096, 7), (5, 5, 3), (3, 64, 1)])
def test_the_window_follows_its_definition_and_only_grows(kind, start, full, ramp):
    schedule = WindowSchedule(kind, start, full, ramp)
    windows = [schedule.window(step) for step in range(ramp + 5)]
    assert windows == [reference_window(kind, start, full, ramp, step) for step in range(ramp + 5)]
    assert windows == sorted(windows), "the window never shrinks"
    assert windows[ramp:] == [full] * 5, "full from the end of the ramp on"
    assert windows[0] == (full if kind == "none" else start)
    assert schedule.windows() == sorted(set(windows))


def test_the_stages_double():
    assert [WindowSchedule("step", 8, 40, 6).window(s) for s in range(7)] == [8, 8, 16, 16, 32, 32, 40]
    assert [WindowSchedule("linear", 8, 32, 4).window(s) for s in range(5)] == [8, 14, 20, 26, 32]


def test_windows_are_multiples_for_context_parallelism():
    schedule = WindowSchedule("linear", 16, 256, 10, multiple=8)
    assert all(w % 8 == 0 and w >= 16 for w in schedule.windows())
    with pytest.raises(ValueError, match=r"window_start \(12 tokens\) is not a multiple of 8"):
        WindowSchedule("linear", 12, 256, 10, multiple=8)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("linear", 64, 32, 4), r"window_start=64 exceeds the full window of 32 tokens"),
        (("linear", 8, 32, 0), r"window_ramp_steps must be an integer >= 1, got 0"),
        (("cosine", 8, 32, 4), r"window_schedule must be one of none, linear, step; got 'cosine'"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_value(args, match):
    with pytest.raises(ValueError, match=match):
        WindowSchedule(*args)


def test_the_window_of_a_step_is_the_same_on_every_process(assets, tmp_path):
    """Two processes' micro-batches of each step, with gradient accumulation and the long/short mix."""
    run = scheduled(assets, tmp_path, window_schedule="linear", global_batch_size=8)
    schedule = WindowSchedule("linear", 8, 32, 4)
    blocks = np.arange(40 * 32).reshape(40, 32) % 250
    shorts = np.ones((8, 2, 16), dtype=np.int32)
    per_rank = []
    for rank in (0, 1):
        plan = Plan(32, 128, 128, 32, 16, accumulation=4, dp_size=2, dp_rank=rank, schedule=schedule)
        source = MicroBatches(run, plan, blocks, shorts, "cpu")
        seen = []
        for step in range(6):
            for micro in range(4):
                batch = source.next(step, step * 4 + micro)
                seen.append((step, batch.short, batch.input_ids.shape[1]))
        per_rank.append(seen)
    assert per_rank[0] == per_rank[1]
    for step in range(6):
        lengths = {length for s, short, length in per_rank[0] if s == step and not short}
        assert lengths == {schedule.window(step)}, "one window for every long micro-batch of a step"


def scheduled(assets, out, **overrides) -> TrainConfig:
    """The mixed run of test_mix (PoSE windows of 32 over 128 positions) with a window schedule, 4 micro-batches."""
    values = dict(
        window_schedule="step",
        window_start=8,
        window_ramp_steps=4,
        short_fraction=0.25,
        global_batch_size=4,
        max_train_steps=6,
    )
    values.update(overrides)
    return mixed(assets, out, **values)


def test_a_scheduled_run_trains_each_step_on_its_window(assets, tmp_path, monkeypatch):
    seen = record_forward_loss(
        monkeypatch, lambda model, ids, positions, pose, kw, loss: (ids.shape[1], pose, int(positions.max()))
    )
    result = train(scheduled(assets, tmp_path))
    schedule = WindowSchedule("step", 8, 32, 4)
    assert len(seen) == 6 * 4
    for step in range(6):
        micro = seen[step * 4 : step * 4 + 4]
        long = [length for length, pose, _ in micro if pose]
        assert long == [schedule.window(step)] * len(long) and len(long) == 3, (step, micro)
        assert [length for length, pose, _ in micro if not pose] == [16], "the short side keeps its length"
    assert all(top < 128 for _, _, top in seen), "PoSE positions still span seq_len, never past it"
    assert max(top for _, pose, top in seen if pose) >= 32
    assert result.tokens == sum(length for length, _, _ in seen)
    card = (result.output_dir / "README.md").read_text()
    assert "step from 8 to 32 tokens over 4 steps" in card
    trained = json.loads((result.output_dir / "train_results.json").read_text())["windows"]
    assert trained == [schedule.window(step) for step in range(6)] and trained[-2:] == [32, 32]


def test_a_run_killed_mid_schedule_resumes_with_the_same_losses(assets, tmp_path):
    reference = train(scheduled(assets, tmp_path / "straight", checkpointing_steps=2))
    crashed = scheduled(assets, tmp_path / "crashed", checkpointing_steps=2)
    script = KILL_SCRIPT.format(kill_step=3, values=crashed.to_dict())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=SUBPROCESS_ENV)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert latest_checkpoint(crashed.checkpoint_path).name == "step_00000002", "killed within the ramp"
    resumed = train(scheduled(assets, tmp_path / "crashed", checkpointing_steps=2, resume="latest"))
    assert resumed.losses == reference.losses
    assert resumed.tokens == reference.tokens


def test_resuming_with_another_schedule_is_refused(assets, tmp_path):
    train(scheduled(assets, tmp_path, max_train_steps=2, warmup_steps=0, window_ramp_steps=1, checkpointing_steps=2))
    with pytest.raises(ValueError, match=r"window_schedule: 'step' -> 'linear'"):
        train(
            scheduled(
                assets,
                tmp_path,
                max_train_steps=2,
                warmup_steps=0,
                window_ramp_steps=1,
                window_schedule="linear",
                resume="latest",
            )
        )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"window_schedule": "cosine"}, r"window_schedule must be one of none, linear, step; got 'cosine'"),
        ({"window_start": 1}, r"window_start must be an integer >= 2"),
        ({"window_ramp_steps": 0}, r"window_ramp_steps must be an integer >= 1"),
        ({"window_ramp_steps": 7}, r"window_ramp_steps=7 with max_train_steps=6: the full window would never"),
        ({"window_ramp_steps": 6}, r"window_ramp_steps=6 with max_train_steps=6: .* use at most 5"),
        ({"max_train_steps": 1, "window_ramp_steps": None}, r"window_schedule=step needs max_train_steps >= 2"),
        ({"window_schedule": "none"}, r"window_start and window_ramp_steps shape a window_schedule.*none"),
    ],
)
def test_bad_schedule_settings_are_one_line_before_training(assets, tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        scheduled(assets, tmp_path, **overrides)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"window_start": 40}, r"window_start=40 exceeds the full window of 32 tokens"),
        ({"window_start": 2, "pose_chunks": 3}, r"pose_chunks=3 exceeds the first window of 2 tokens"),
    ],
)
def test_a_schedule_the_model_cannot_follow_is_refused_before_training(assets, tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        train(scheduled(assets, tmp_path, **overrides))
    assert not (tmp_path / "model").exists()


RECORDING_DRIVER = """
import torch
from hf_posext.train import loop
from hf_posext.train.config import TrainConfig

seen, real = [], loop.forward_loss

def recording(model, input_ids, position_ids, pose=False, **kwargs):
    seen.append((tuple(input_ids.shape), pose))
    return real(model, input_ids, position_ids, pose=pose, **kwargs)

loop.forward_loss = recording
result = loop.train(TrainConfig(**{values!r}))
rank = torch.distributed.get_rank()
weights = {{k: v.detach().clone() for k, v in result.model.state_dict().items()}}
torch.save({{"seen": seen, "losses": result.losses, "weights": weights}}, f"{out}/rank{{rank}}.pt")
"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
    reason="torchrun is not installed next to this Python",
)
def test_two_processes_train_each_step_on_one_window(assets, tmp_path):
    """torchrun, 2 CPU processes (gloo): the schedule, the mix and LongRoPE's pinned factors under DDP."""
    run = scheduled(assets, tmp_path, method="longrope", max_train_steps=4, window_ramp_steps=3, global_batch_size=4)
    (tmp_path / "driver.py").write_text(RECORDING_DRIVER.format(values=run.to_dict(), out=tmp_path))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(tmp_path / "driver.py")],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    assert ranks[0]["seen"] == ranks[1]["seen"], "every micro-batch has one shape on both processes"
    assert ranks[0]["losses"] == ranks[1]["losses"]
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][name]), name
    schedule = WindowSchedule("step", 8, 32, 3)
    seen = ranks[0]["seen"]  # micro-batch k of a process belongs to step k // 2 (2 accumulated per step)
    assert len(seen) == 8 and [pose for _, pose in seen].count(False) == 2
    assert all(shape[1] == (schedule.window(k // 2) if pose else 16) for k, (shape, pose) in enumerate(seen))
    assert {shape[1] for shape, pose in seen if pose} == {8, 16, 32}
