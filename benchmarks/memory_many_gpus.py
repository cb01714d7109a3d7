"""Per-GPU memory of one Llama-3-8B training step of the recipe at 32k / 64k / 128k, computed (not measured).

Arithmetic from the model's shapes and the recipe's defaults, term by term (docs/guides/many_gpus.md
explains each): model states (fp32 master weights, fp32 gradients, AdamW's two fp32 moments; sharded
over the GPUs by FSDP2 / ZeRO-3), checkpointed layer inputs, one layer's activations recomputed in
the backward plus its largest gradients, the logits of the loss (chunked or not), and the gathered
parameters of FSDP2 / ZeRO-3. The markdown tables the docs page quotes are printed; rows
(``result_schema.py``, metric ``gib_per_gpu``) go to ``benchmarks/results/memory_many_gpus.json``.

    python benchmarks/memory_many_gpus.py            # instant; no torch needed
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import current_versions
from result_schema import Row, write_rows

RESULTS = Path(__file__).parent / "results" / "memory_many_gpus.json"
GIB = 2**30
LENGTHS = (32_768, 65_536, 131_072)


@dataclasses.dataclass(frozen=True)
class Model:
    """Meta-Llama-3-8B's config.json."""

    layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128_256

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def layer(self) -> int:
        kv = self.hidden * self.kv_heads // self.heads
        return (
            2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate + 2 * self.hidden
        )

    @property
    def params(self) -> int:
        return self.layers * self.layer + 2 * self.embedding + self.hidden  # untied embedding and LM head

    def lora(self, rank: int = 8) -> int:
        """LoRA r=8 on q/k/v/o (the recipe's default), plus the trainable embedding and norms (LongLoRA)."""
        kv = self.hidden * self.kv_heads // self.heads
        per_layer = rank * (2 * (self.hidden + self.hidden) + 2 * (self.hidden + kv)) + 2 * self.hidden
        return self.layers * per_layer + self.embedding + self.hidden


@dataclasses.dataclass(frozen=True)
class Option:
    """A way to run the step: how many GPUs share the model states, how many share each sequence."""

    name: str
    config: str
    shard: int  # GPUs the model states are sharded over (1: every GPU holds them all)
    split: int  # GPUs each sequence is split over (context or sequence parallelism)
    lora: bool = False
    act_bytes: int = 2  # the residual stream: bf16 under FSDP2/ZeRO's bf16 policy, fp32 under autocast (DDP)


OPTIONS = (
    Option("one GPU or DDP, full", "single_gpu.yaml / ddp.yaml", 1, 1, act_bytes=4),
    Option("one GPU or DDP, --lora", "single_gpu.yaml / ddp.yaml", 1, 1, lora=True, act_bytes=4),
    Option("FSDP2 x 8, full", "fsdp2.yaml", 8, 1),
    Option("FSDP2 x 8, --lora", "fsdp2.yaml", 8, 1, lora=True),
    Option("ZeRO-3 x 8, full", "deepspeed_zero3.yaml", 8, 1),
    Option("ZeRO-3 + Ulysses --sp-size 8", "deepspeed_ulysses.yaml", 8, 8),
    Option("FSDP2 + context parallel 8", "context_parallel.yaml", 8, 8),
)


def terms(model: Model, option: Option, length: int, checkpointing: bool = True, chunk: int = 1024) -> dict:
    """GiB per GPU of each part of one micro-step (one sequence of ``length`` tokens per data-parallel rank)."""
    tokens = length // option.split  # the tokens this GPU embeds, checkpoints and scores
    trained = model.lora() if option.lora else model.params
    # fp32 master weights (4 bytes) of everything; fp32 gradients (4) and AdamW's moments (8) of the trained
    states = (4 * model.params + 12 * trained) / option.shard
    # one layer's saved activations per token (bf16): norm out, q, k, v, attention out, o_proj in (~6h),
    # gate, up, act(gate), gate*up (4I); plus the backward's largest transient, the MLP's gradients (2I)
    per_token_layer = (6 * model.hidden + 6 * model.intermediate) * 2
    if checkpointing:
        activations = model.layers * tokens * model.hidden * option.act_bytes + tokens * per_token_layer
    else:
        activations = model.layers * tokens * (6 * model.hidden + 4 * model.intermediate) * 2 + tokens * per_token_layer
    # logits: bf16 from the head, fp32 for the loss, fp32 gradient (10 bytes a value)
    logits = (min(chunk, tokens) if chunk else tokens) * model.vocab * 10
    # gathered bf16 parameters while sharded: two layers (the running one and the prefetched one),
    # the embedding and the LM head (the tail is kept gathered between forward and backward)
    gathered = (2 * model.layer + 2 * model.embedding) * 2 if option.shard > 1 else 0
    return {
        "model states": states / GIB,
        "activations": activations / GIB,
        "logits": logits / GIB,
        "gathered": gathered / GIB,
    }


def total(parts: dict) -> float:
    return sum(parts.values())


def main() -> None:
    model = Model()
    print(f"Llama-3-8B: {model.params / 1e9:.2f}B parameters, LoRA trains {model.lora() / 1e6:.0f}M\n")
    print("| option | accelerate config | " + " | ".join(f"{n // 1024}k" for n in LENGTHS) + " |")
    print("|---|---|" + "---:|" * len(LENGTHS))
    rows = []
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    versions = current_versions()  # the formulas' code: hf-posext and this checkout's commit

    def row(option: Option, setting: dict[str, Any], parts: dict[str, float], extra: dict[str, float]) -> Row:
        """A computed total of ``option`` as a row of the schema (``extra``: its terms, where the table shows them)."""
        extra = {"config": option.config, **extra}
        return Row(
            "memory_many_gpus",
            option.name,
            setting,
            "gib_per_gpu",
            round(total(parts), 1),
            "GiB",
            "computed",
            versions,
            now,
            extra,
        )

    for option in OPTIONS:
        cells = []
        for length in LENGTHS:
            parts = terms(model, option, length)
            cells.append(f"{total(parts):.0f}")
            setting = {"length": length, "activation_checkpointing": True, "loss_chunk_size": 1024}
            extra = {key: round(value, 2) for key, value in parts.items()}
            rows.append(row(option, setting, parts, extra))
        print(f"| {option.name} | `{option.config}` | " + " | ".join(cells) + " |")
    print("\nFSDP2 x 8, full fine-tune, at 64k: what each default saves\n")
    print("| activation checkpointing | chunked loss | model states | activations | logits | gathered | total |")
    print("|---|---|---:|---:|---:|---:|---:|")
    fsdp2 = OPTIONS[2]
    for checkpointing in (True, False):
        for chunk in (1024, 0):
            parts = terms(model, fsdp2, 65_536, checkpointing, chunk)
            cells = " | ".join(f"{value:.1f}" for value in parts.values())
            print(f"| {'on' if checkpointing else 'off'} | {'on' if chunk else 'off'} | {cells} | {total(parts):.0f} |")
            setting = {"length": 65_536, "activation_checkpointing": checkpointing, "loss_chunk_size": chunk}
            rows.append(row(fsdp2, setting, parts, {}))
    write_rows(RESULTS, rows, replace=lambda row: row.benchmark == "memory_many_gpus")


if __name__ == "__main__":
    main()
