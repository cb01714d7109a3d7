"""The ``Accelerator`` of a fine-tune run and its data-parallel layout; the strategy comes from the launcher.

DDP, FSDP2, DeepSpeed ZeRO-3 and context parallelism are chosen by the ``accelerate launch``
config (examples/accelerate/*.yaml), never here.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import is_bf16_available

from .config import TrainConfig


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX), through oneDNN.

    There, bf16 autocast runs a training step about 2x faster than fp32
    (benchmarks/bench_cpu_bf16.py); on other CPUs bf16 is emulated and slower than fp32.
    """
    # torch has no public query; mkldnn's own check is what its bf16 matmul dispatch uses.
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and check is not None and check())


def resolve_mixed_precision(choice: str) -> str | None:
    """``auto``: the launcher's setting if any, else bf16 where the device computes it natively, else fp32.

    Natively: an accelerator with bf16 (CUDA, XPU, MPS, ...), or a CPU with bf16 matrix
    instructions (:func:`cpu_has_native_bf16`). Returns None to let ``Accelerator`` read the
    launcher's setting.
    """
    if choice != "auto":
        return choice
    if os.environ.get("ACCELERATE_MIXED_PRECISION"):
        return None
    # A second run in one process (a notebook, a test): accelerate refuses another precision than
    # the first Accelerator's, so "auto" keeps the process's (its state is a class-level dict).
    if getattr(AcceleratorState, "_shared_state", None):
        return None
    if torch.accelerator.is_available():
        return "bf16" if is_bf16_available() else "no"
    # is_bf16_available is True on any CPU, also where bf16 is emulated and slower than fp32.
    return "bf16" if cpu_has_native_bf16() else "no"


def build_accelerator(config: TrainConfig, accumulation: int = 1) -> Accelerator:
    """An ``Accelerator`` for ``config``; the strategy (DDP, FSDP2, ...) comes from the launcher."""
    kwargs: dict[str, Any] = {"gradient_accumulation_steps": accumulation}
    mixed = resolve_mixed_precision(config.mixed_precision)
    if mixed is not None:
        kwargs["mixed_precision"] = mixed
    if config.report_to != "none":
        kwargs["log_with"] = config.report_to
        kwargs["project_dir"] = str(config.checkpoint_path / "logs")
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and not torch.accelerator.is_available():
        # Under torchrun on a machine without accelerators, accelerate only goes multi-process
        # (gloo) when told it runs on CPU; otherwise every rank silently trains alone.
        kwargs["cpu"] = True
    accelerator = Accelerator(**kwargs)
    if accelerator.num_processes != launched:
        raise RuntimeError(
            f"launched with WORLD_SIZE={launched} but accelerate runs {accelerator.num_processes} process(es); "
            "start multi-process runs with accelerate launch or torchrun"
        )
    return accelerator


def data_parallel_layout(accelerator: Accelerator) -> tuple[int, int]:
    """``(size, rank)`` of the data-parallel group: context/tensor-parallel peers share a batch."""
    pc = accelerator.parallelism_config
    if pc is not None and pc.non_data_parallel_size > 1:
        if pc.data_parallel_size == 1:
            return 1, 0
        return pc.data_parallel_size, accelerator.torch_device_mesh["dp"].get_local_rank()
    return accelerator.num_processes, accelerator.process_index
