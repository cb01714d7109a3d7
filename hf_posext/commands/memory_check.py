"""The memory plan both commands use: ``hf-posext plan`` prints it, ``hf-posext finetune`` checks it first.

The layout flags (``--memory``, and for ``plan`` ``--processes``, ``--strategy``, ``--device``), the model's
shape from its config.json alone, the plan (`hf_posext.train.memory`) and its rendering, and
`check_fits`: finetune's refusal of a run that does not fit, before the model loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from .arguments import positive_number, whole

if TYPE_CHECKING:
    from ..train.config import TrainConfig
    from ..train.memory import Layout, ModelShape

GIB = 2**30


def memory_gib(text: str) -> float:
    """``--memory``: GiB per device, a number > 0."""
    return positive_number(text, "must be > 0 (GiB of memory per device)")


def add_layout_arguments(parser: argparse.ArgumentParser, launched: bool = False) -> None:
    """``--memory`` (both commands) and, unless ``launched`` (finetune reads them from its launcher), the layout."""
    parser.add_argument(
        "--memory",
        type=memory_gib,
        default=None,
        metavar="GIB",
        help="memory per device, GiB; default: a CUDA device's own, none on CPU (the plan then only reports)",
    )
    if launched:
        return
    parser.add_argument("--processes", type=whole(1), default=1, help="processes (devices) the run is launched on")
    parser.add_argument(
        "--strategy",
        choices=("ddp", "fsdp2", "zero3"),
        default=None,
        help="how the processes share the model: ddp (each holds it all), fsdp2 or zero3 (sharded); "
        "default fsdp2 on more than one process",
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="what each process runs on; default cuda if present"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def read_shape(model: str) -> ModelShape:
    """The sizes of ``model`` (a folder with a config.json, a Hub id, or a .gguf file) without its weights.

    Raises:
        ValueError: a config transformers cannot read or that lacks the sizes the plan needs.
        OSError: no config to read.
    """
    from ..gguf import resolve_model_source
    from ..train.memory import ModelShape
    from ..validation.saved_model import read_config

    source = resolve_model_source(model)
    config = read_config(source)
    where = os.path.join(source, "config.json")
    if os.path.isfile(where):  # the file as written: transformers would fill a missing size with its default
        with open(where) as handle:
            return ModelShape.from_config(json.load(handle), where)
    return ModelShape.from_config(config, source)


def resolve_layout(config: TrainConfig, processes: int, strategy: str | None, device: str | None) -> Layout:
    """The `hf_posext.train.memory.Layout` of the flags; ``mixed_precision`` read as the recipe reads it."""
    import torch

    from ..train.distributed import cpu_has_native_bf16
    from ..train.memory import Layout

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    strategy = strategy or ("fsdp2" if processes > 1 else "ddp")
    if config.mixed_precision == "auto":
        bf16 = device == "cuda" or cpu_has_native_bf16()
    else:
        bf16 = config.mixed_precision in ("bf16", "fp16")
    if device == "cpu" and strategy == "zero3":
        raise ValueError("--strategy zero3 on --device cpu: DeepSpeed runs on GPUs only; on CPU use fsdp2")
    if device == "cpu" and config.activation_offload:
        raise ValueError(
            "activation_offload moves checkpointed activations from an accelerator to host memory; "
            "on --device cpu set activation_offload=False"
        )
    if config.sp_size > 1 and strategy != "zero3":
        raise ValueError(f"sp_size={config.sp_size} runs inside DeepSpeed (ZeRO-3 + Ulysses): use --strategy zero3")
    return Layout(processes, strategy, device, bf16)  # type: ignore[arg-type]


def make_plan(config: TrainConfig, shape: ModelShape, layout: Layout, memory: float | None) -> dict[str, Any]:
    """The plan as a JSON-ready mapping: every term, the peak, whether it fits, the longest fit, tokens/s."""
    import torch

    from ..train.memory import estimate_memory, longest_fit, reference_data, tokens_per_second

    memory_bytes = int(memory * GIB) if memory is not None else None
    estimate = estimate_memory(shape, config, layout, memory_bytes=memory_bytes)
    rate = reference_data()["flop_rates"].get(layout.device)
    flops = None
    if rate is not None:  # recorded per thread on CPU
        flops = rate["flops_per_s"] * (torch.get_num_threads() if layout.device == "cpu" else 1)
    return {
        "model": config.model,
        "method": config.method,
        "factor": config.factor,
        "seq_len": estimate.seq_len,
        "window": estimate.window,
        "tokens_per_process": estimate.tokens,
        "lora": config.lora,
        "processes": layout.processes,
        "strategy": layout.strategy,
        "device": layout.device,
        "precision": "bf16" if layout.bf16 else "fp32",
        "parameters": shape.params,
        "trainable_parameters": estimate.trainable_params,
        "terms_bytes": estimate.terms,
        "moments_bytes": estimate.moments,
        "peak_at": max(estimate.moments, key=lambda k: estimate.moments[k]),
        "peak_bytes": estimate.peak_bytes,
        "memory_bytes": memory_bytes,
        "fits": estimate.fits,
        "longest_fit": longest_fit(shape, config, layout, memory_bytes) if memory_bytes else None,
        "tokens_per_s": tokens_per_second(shape, config, estimate, flops) * layout.processes if flops else None,
        "notes": estimate.notes,
    }


def render(plan: dict[str, Any]) -> str:
    """The plan as the lines ``hf-posext plan`` prints."""
    kind = "LoRA" if plan["lora"] else "full fine-tune"
    lines = [
        f"plan: {plan['model']}, {plan['method']} x{plan['factor']:g}, seq_len {plan['seq_len']} "
        f"(window {plan['window']}), {kind}; {plan['processes']} process(es), {plan['strategy']}, "
        f"{plan['device']}, {plan['precision']}",
        f"per process ({plan['trainable_parameters'] / 1e6:,.1f}M of {plan['parameters'] / 1e6:,.1f}M parameters "
        "trained):",
    ]
    for name, value in plan["terms_bytes"].items():
        lines.append(f"  {name:<12} {value / GIB:9.2f} GiB")
    lines.append(f"  {'peak':<12} {plan['peak_bytes'] / GIB:9.2f} GiB  (at the {plan['peak_at']})")
    if plan["memory_bytes"] is None:
        lines.append("  memory: not given (--memory GiB): fit not judged")
    else:
        verdict = "fits" if plan["fits"] else "does NOT fit"
        longest = plan["longest_fit"]
        lines.append(f"  memory {plan['memory_bytes'] / GIB:g} GiB per device: {verdict}")
        lines.append(f"  longest seq_len that fits: {longest if longest else 'none (not even 128 tokens)'}")
    if plan["tokens_per_s"]:
        lines.append(f"  estimated {plan['tokens_per_s']:,.0f} tokens/s over all processes (recorded FLOP rate)")
    lines += [f"  note: {note}" for note in plan["notes"]]
    return "\n".join(lines)


def launched_layout(config: TrainConfig) -> Layout:
    """The layout of this process's launch: ``WORLD_SIZE`` and the strategy ``accelerate launch`` wrote."""
    import torch

    from ..train.distributed import Requested

    requested = Requested.read(config)
    strategy = "fsdp2" if requested.fsdp_version == 2 else "zero3" if requested.deepspeed else "ddp"
    on_cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "false").lower() == "true"
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    return resolve_layout(config, processes, strategy, "cpu" if on_cpu else "cuda")


def check_fits(config: TrainConfig, memory: float | None, force: bool) -> dict[str, Any] | None:
    """``hf-posext finetune``'s first lines: the plan's peak, and a refusal when it does not fit.

    The memory is ``memory`` GiB, else the CUDA device's own; on CPU without ``memory`` nothing is refused
    (system RAM is shared with every other process, so its size says little). A model whose config the
    plan cannot read is reported and trained anyway: loading it gives the real error.

    Raises:
        ValueError: the plan's peak is above the memory and ``force`` is not set, naming the longest
            seq_len that fits.
    """
    import torch

    main = os.environ.get("RANK", "0") == "0"
    try:
        shape = read_shape(config.model)
    except (ValueError, OSError) as err:
        if main:
            print(f"memory plan: not computed ({' '.join(str(err).split())})")
        return None
    layout = launched_layout(config)
    if memory is None and layout.device == "cuda":
        memory = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory / GIB
    plan = make_plan(config, shape, layout, memory)
    peak = plan["peak_bytes"] / GIB
    if main:
        where = f"{layout.processes} process(es), {layout.strategy}, {layout.device}"
        budget = f" of {memory:g} GiB" if memory is not None else " (no --memory: not checked on CPU)"
        print(f"memory plan: peak {peak:.2f} GiB per process{budget} at seq_len {plan['seq_len']} ({where})")
    if plan["fits"] is False:
        longest = plan["longest_fit"]
        message = (
            f"the memory plan's peak is {peak:.2f} GiB per process, more than the {memory:g} GiB per device: "
            f"{'the longest seq_len that fits is ' + str(longest) if longest else 'not even 128 tokens fit'} "
            "(hf-posext plan with the same flags shows each term); --force runs it anyway"
        )
        if not force:
            raise ValueError(message)
        if main:
            print(f"warning: --force: {message.removesuffix('; --force runs it anyway')}", file=sys.stderr)
    return plan
