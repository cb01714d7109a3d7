"""The ``Accelerator`` of a fine-tune run, its data-parallel layout, and what the launcher asked for.

DDP, FSDP2, DeepSpeed ZeRO-3 and context parallelism are chosen by the ``accelerate launch``
config (examples/accelerate/*.yaml); sequence parallelism (DeepSpeed Ulysses) by ``sp_size``.
A strategy the run cannot give is refused by name, never dropped: accelerate turns FSDP and
DeepSpeed on only for GPU-type runs, so on CPU it would silently run DDP. FSDP2 does run on CPU
(torch's ``fully_shard`` on gloo): there the run is switched to it (`build_accelerator`).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from accelerate import Accelerator, ParallelismConfig
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, is_bf16_available
from torch.distributed.fsdp import FSDPModule

from ..validation import require
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
    instructions (`cpu_has_native_bf16`). Returns None to let ``Accelerator`` read the
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


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


@dataclass(frozen=True)
class Requested:
    """The parallelism a run asks for: the launcher's environment (what ``accelerate launch`` writes
    from its config file, accelerate/utils/launch.py) plus the recipe's ``sp_size``."""

    fsdp_version: int | None = None
    deepspeed: bool = False
    cp_size: int = 1
    tp_size: int = 1
    sp_size: int = 1

    @classmethod
    def read(cls, config: TrainConfig) -> Requested:
        sizes = {"cp_size": 1, "tp_size": 1}
        if _flag("ACCELERATE_USE_PARALLELISM_CONFIG"):
            sizes = {key: int(os.environ.get(f"PARALLELISM_CONFIG_{key.upper()}", "1")) for key in sizes}
        return cls(
            fsdp_version=int(os.environ.get("FSDP_VERSION", "1")) if _flag("ACCELERATE_USE_FSDP") else None,
            deepspeed=_flag("ACCELERATE_USE_DEEPSPEED"),
            sp_size=config.sp_size,
            **sizes,
        )


def check_requested(requested: Requested, on_cpu: bool) -> None:
    """Refuse what the run cannot give, naming it and why (before any process group is built).

    Raises:
        ValueError: on CPU, DeepSpeed, FSDP1 or context parallelism (accelerate and torch have no
            CPU path for them); anywhere, tensor parallelism (the recipe does not shard layers), and
            sequence parallelism without a DeepSpeed config (accelerate runs Ulysses only there).
    """
    if requested.tp_size > 1:
        raise ValueError(
            f"the accelerate config asks for tensor parallelism (tp_size={requested.tp_size}), which the recipe "
            "does not run (it loads whole layers); use FSDP2 (examples/accelerate/fsdp2.yaml) to shard the model"
        )
    if requested.sp_size > 1 and (on_cpu or not requested.deepspeed):
        where = "this run is on CPU" if on_cpu else "this accelerate config is not a DeepSpeed one"
        raise ValueError(
            f"sp_size={requested.sp_size}: DeepSpeed Ulysses sequence parallelism runs inside accelerate's DeepSpeed "
            f"engine, on GPUs only, and {where}; launch with examples/accelerate/deepspeed_ulysses.yaml on GPUs, "
            "or set sp_size=1"
        )
    if not on_cpu:
        return
    if requested.deepspeed:
        raise ValueError(
            "the accelerate config asks for DeepSpeed, which accelerate runs on GPUs only (on this CPU run it "
            "would silently be plain DDP, nothing sharded); on CPU use FSDP2 (examples/accelerate/fsdp2.yaml)"
        )
    if requested.fsdp_version == 1:
        raise ValueError(
            "the accelerate config asks for FSDP version 1, which does not run on CPU (on this run it would "
            "silently be plain DDP); set fsdp_version: 2 (examples/accelerate/fsdp2.yaml), which does"
        )
    if requested.cp_size > 1:
        raise ValueError(
            f"the accelerate config asks for context parallelism (cp_size={requested.cp_size}), which has no CPU "
            "path: torch's context_parallel has no sharding strategy for CPU attention; run it on GPUs"
        )


def build_accelerator(config: TrainConfig, accumulation: int = 1) -> Accelerator:
    """An ``Accelerator`` for ``config``; the strategy (DDP, FSDP2, ...) comes from the launcher.

    Raises:
        ValueError: a strategy the run cannot give (`check_requested`).
        RuntimeError: a launch whose process count accelerate does not see.
    """
    kwargs: dict[str, Any] = {"gradient_accumulation_steps": accumulation}
    mixed = resolve_mixed_precision(config.mixed_precision)
    if mixed is not None:
        kwargs["mixed_precision"] = mixed
    if config.report_to != "none":
        kwargs["log_with"] = config.report_to
        kwargs["project_dir"] = str(config.checkpoint_path / "logs")
    requested = Requested.read(config)
    on_cpu = not torch.accelerator.is_available() or _flag("ACCELERATE_USE_CPU")
    check_requested(requested, on_cpu)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if requested.sp_size > 1:
        require("deepspeed", "deepspeed", f"sp_size={requested.sp_size} (DeepSpeed Ulysses sequence parallelism)")
        if launched % requested.sp_size:
            raise ValueError(f"sp_size={requested.sp_size} does not divide the {launched} processes launched")
        kwargs["parallelism_config"] = ParallelismConfig(sp_backend="deepspeed", sp_size=requested.sp_size)
    cpu_fsdp2 = on_cpu and requested.fsdp_version == 2 and launched > 1
    if cpu_fsdp2:
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* environment
    if launched > 1 and on_cpu:
        # Under torchrun on a machine without accelerators, accelerate only goes multi-process
        # (gloo) when told it runs on CPU; otherwise every rank silently trains alone.
        kwargs["cpu"] = True
    accelerator = Accelerator(**kwargs)
    if accelerator.num_processes != launched:
        raise RuntimeError(
            f"launched with WORLD_SIZE={launched} but accelerate runs {accelerator.num_processes} process(es); "
            "start multi-process runs with accelerate launch or torchrun"
        )
    if cpu_fsdp2:
        _fsdp2_on_cpu(accelerator, kwargs["fsdp_plugin"])
    return accelerator


def _fsdp2_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> None:
    """Run ``accelerator`` as FSDP2 on CPU: accelerate's own FSDP2 code paths (``prepare``, saving,
    clipping, accumulation) over gloo, as on GPUs.

    accelerate 1.16 (``AcceleratorState.__init__``) sets ``distributed_type = FSDP`` only for
    GPU-type runs and otherwise drops the plugin; torch's ``fully_shard`` itself runs on gloo.
    """
    state = accelerator.state
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin


def data_parallel_layout(accelerator: Accelerator) -> tuple[int, int]:
    """``(size, rank)`` of the data-parallel group: context/sequence/tensor-parallel peers share a batch."""
    pc = accelerator.parallelism_config
    if pc is not None and pc.non_data_parallel_size > 1:
        if pc.sp_enabled:  # DeepSpeed's groups: consecutive ranks share a sequence
            return accelerator.num_processes // pc.sp_size, accelerator.process_index // pc.sp_size
        if pc.data_parallel_size == 1:
            return 1, 0
        return pc.data_parallel_size, accelerator.torch_device_mesh["dp"].get_local_rank()
    return accelerator.num_processes, accelerator.process_index


def describe_strategy(accelerator: Accelerator, model: nn.Module, dp_size: int) -> str:
    """One line for the log at start: the distributed type, the processes, what is sharded and how."""
    kind = accelerator.distributed_type
    head = f"distributed: {kind.value}, {accelerator.num_processes} process(es), data-parallel {dp_size}"
    pc = accelerator.parallelism_config
    if pc is not None and pc.sp_enabled:
        head += f", sequence-parallel {pc.sp_size} (DeepSpeed Ulysses: each sequence split, heads all-to-all)"
    if kind == DistributedType.FSDP:
        plugin = accelerator.state.fsdp_plugin
        units = [module for module in model.modules() if isinstance(module, FSDPModule)]
        names = Counter(type(module).__name__.removeprefix("FSDP") for module in units)
        policy = plugin.mixed_precision_policy
        precision = "fp32"
        if policy is not None and policy.param_dtype is not None:
            precision = f"params in {policy.param_dtype}, gradients reduced in {policy.reduce_dtype or 'fp32'}"
        return (
            f"{head}; FSDP{plugin.fsdp_version} (torch fully_shard over {dist.get_backend()}): parameters, gradients "
            f"and optimizer states sharded over {accelerator.num_processes} in {len(units)} units "
            f"({', '.join(f'{name} x{count}' for name, count in names.items())}); mixed precision: {precision}; "
            f"training states saved as {plugin.state_dict_type.name}"
        )
    if kind == DistributedType.DEEPSPEED:
        stage = accelerator.state.deepspeed_plugin.zero_stage
        sharded = {0: "nothing", 1: "optimizer states", 2: "gradients and optimizer states"}.get(
            stage, "parameters, gradients and optimizer states"
        )
        return f"{head}; DeepSpeed ZeRO stage {stage}: {sharded} sharded over the data-parallel processes"
    if accelerator.num_processes > 1:
        return f"{head}; DDP: nothing sharded, every process holds the whole model and optimizer, gradients all-reduced"
    return f"{head}; nothing sharded"
