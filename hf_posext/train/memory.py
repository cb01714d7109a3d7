"""How much memory one process of a fine-tune needs, predicted from the model's config.json and the run's settings.

`estimate_memory` adds up, per process, the tensors the recipe (`hf_posext.train.loop`) keeps
alive at its worst moment (end of the forward, the backward, the optimizer step, loading);
`longest_fit` searches the longest sequence that fits a budget. The maths term by term and the
sweep that checks it against measured peaks (``benchmarks/plan_memory.py``): docs/guides/many_gpus.md.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from ..methods import method_class
from .config import TrainConfig

GIB = 2**30
Strategy = Literal["ddp", "fsdp2", "zero3"]
Device = Literal["cpu", "cuda"]
STRATEGIES = ("ddp", "fsdp2", "zero3")
#: The config.json fields the plan needs (``head_dim`` and ``num_key_value_heads`` have defaults).
REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size")
#: Values per token that one decoder layer holds while it is recomputed and differentiated, in units of
#: the hidden size, the key/value width and the MLP width: the two norm outputs, q and k rotated, the
#: attention output and its contiguous copy, the residual sum and the grouped heads' repeated k and v
#: (8 hidden); k and v (2 kv); the MLP's gate, up, activation and product and the gradients of two of
#: them (6 MLP).
LAYER_HIDDEN, LAYER_KV, LAYER_INTERMEDIATE = 8, 2, 6
#: The shortest and longest sequence `longest_fit` searches.
SEARCH_RANGE = (128, 1 << 24)


def reference_data() -> dict[str, Any]:
    """The shipped measurements and public configs the plan uses (``memory_reference.json``: sources inside)."""
    return json.loads(resources.files(__package__).joinpath("memory_reference.json").read_text())


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on (from its config.json)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    original_context: int
    attention_bias: bool = False

    @classmethod
    def from_config(cls, config: Any, source: str = "config.json") -> ModelShape:
        """The shape of a ``transformers`` config object or a config.json mapping.

        Raises:
            ValueError: a size the plan needs is missing or not a positive integer (naming it and ``source``).
        """
        values = config if isinstance(config, dict) else config.to_dict()
        values = values.get("text_config") or values
        for name in REQUIRED_FIELDS:
            value = values.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{source}: {name} is {value!r}; the memory plan needs it as a positive integer "
                    f"(a decoder config with {', '.join(REQUIRED_FIELDS)})"
                )
        heads = values["num_attention_heads"]
        rope = values.get("rope_parameters") or values.get("rope_scaling") or {}
        original = rope.get("original_max_position_embeddings") or values.get("max_position_embeddings") or 0
        return cls(
            layers=values["num_hidden_layers"],
            hidden=values["hidden_size"],
            intermediate=values["intermediate_size"],
            heads=heads,
            kv_heads=values.get("num_key_value_heads") or heads,
            head_dim=values.get("head_dim") or values["hidden_size"] // heads,
            vocab=values["vocab_size"],
            tied=bool(values.get("tie_word_embeddings", False)),
            original_context=int(original),
            attention_bias=bool(values.get("attention_bias", False) or values.get("model_type") == "qwen2"),
        )

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def layer(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two norms (and q/k/v biases)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = q + 2 * kv if self.attention_bias else 0
        return self.hidden * (2 * q + 2 * kv) + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer + self.embedding * (1 if self.tied else 2) + self.hidden

    def lora_adapters(self, rank: int, targets: list[str]) -> int:
        """LoRA's A and B matrices over every layer for the ``targets`` this shape has."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        sizes = {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        return self.layers * sum(rank * sum(sizes[t]) for t in targets if t in sizes)


@dataclass(frozen=True)
class Layout:
    """Where a run goes: how many processes, how they share the model, what device each has."""

    processes: int = 1
    strategy: Strategy = "ddp"
    device: Device = "cuda"
    #: compute in bf16 (autocast, or FSDP2's bf16 parameters); fp32 otherwise
    bf16: bool = True

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")

    @property
    def shards(self) -> int:
        return self.processes if self.strategy != "ddp" else 1


@dataclass(frozen=True)
class MemoryEstimate:
    """One process's memory of a run, in bytes; ``terms`` in the order the plan prints them."""

    seq_len: int
    window: int
    tokens: int
    trainable_params: int
    terms: dict[str, int]
    moments: dict[str, int]
    peak_bytes: int
    memory_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        return None if self.memory_bytes is None else self.peak_bytes <= self.memory_bytes


def training_lengths(config: TrainConfig, shape: ModelShape, seq_len: int | None = None) -> tuple[int, int]:
    """``(seq_len, window)``: the trained context and the tokens one forward sees (PoSE's window, or seq_len).

    Raises:
        ValueError: the settings ``plan_run`` refuses once the model is loaded (a sequence beyond the
            patched context, a PoSE window longer than the sequence).
    """

    original = shape.original_context or 0
    context = int(original * config.factor) if original else None
    seq_len = seq_len or config.seq_len or context
    if not seq_len:
        raise ValueError("config.json has no max_position_embeddings: give --seq-len")
    if method_class(config.method).scales_rope and context and seq_len > context:
        raise ValueError(
            f"seq_len={seq_len} exceeds the {context} tokens {config.model!r} takes with {config.method!r} at factor "
            f"{config.factor:g} (original context {original}); use seq_len <= {context} or a larger factor"
        )
    window = seq_len
    if config.pose:
        window = config.pose_window or min(original or seq_len, seq_len)
        if window > seq_len:
            raise ValueError(f"pose_window={window} exceeds seq_len={seq_len}; PoSE trains a shorter window")
    return seq_len, window


def estimate_memory(
    shape: ModelShape,
    config: TrainConfig,
    layout: Layout,
    seq_len: int | None = None,
    memory_bytes: int | None = None,
) -> MemoryEstimate:
    """One process's peak memory for ``config`` on ``layout`` at ``seq_len`` (default the config's).

    Raises:
        ValueError: lengths the recipe would refuse (`training_lengths`), or an ``sp_size`` that
            does not divide the processes or the heads.
    """
    seq_len, window = training_lengths(config, shape, seq_len)
    sp = config.sp_size
    if layout.processes % sp or shape.heads % sp:
        raise ValueError(f"sp_size={sp} must divide the {layout.processes} processes and the {shape.heads} heads")
    reference = reference_data()
    cpu = layout.device == "cpu"
    # What the process computes in: bf16 under autocast or FSDP2's policy (the residual stream: see _activation_bytes).
    act = 2 if layout.bf16 else 4
    tokens = window * config.micro_batch_size // sp
    head_trained = _head_trained(shape, config)
    head_params = shape.embedding if (not shape.tied or not config.lora) else 0

    trainable, terms = _parameter_terms(shape, config, layout)
    layers_saved, layer_working, stored = _activation_bytes(shape, config, layout, tokens, window)
    terms["activations"] = stored + layer_working
    chunk = min(config.loss_chunk_size, tokens) if config.loss_chunk_size else tokens
    # fp32 logits (and the head's bf16 output before them), log-softmax, and their gradients
    logits = chunk * shape.vocab * (12 + (2 if layout.bf16 else 0))
    head_grad = 4 * head_params if config.loss_chunk_size and head_trained else 0
    terms["loss"] = logits + head_grad + tokens * shape.hidden * act
    overhead = reference["overhead"][layout.device]
    terms["overhead"] = int(overhead["bytes"] + overhead.get("fraction", 0.0) * sum(terms.values()))

    moments = _moments(
        shape, config, layout, terms, trainable, tokens, stored=stored, layer_working=layer_working, head_grad=head_grad
    )
    notes = []
    if config.activation_offload and not cpu:
        notes.append(f"activation offload keeps {layers_saved / GIB:.1f} GiB of checkpoints in pinned host memory")
    peak = max(moments.values()) + terms["overhead"]
    return MemoryEstimate(seq_len, window, tokens, trainable, terms, moments, peak, memory_bytes, notes)


def _head_trained(shape: ModelShape, config: TrainConfig) -> bool:
    """Whether the head (the embedding, where tied) is trained: LongLoRA trains an untied one, never a tied one."""
    return not config.lora or not shape.tied


def _parameter_terms(shape: ModelShape, config: TrainConfig, layout: Layout) -> tuple[int, dict[str, int]]:
    """``(trainable parameters, terms)``: the bytes of weights, AdamW's moments, gradients and gathered units."""
    h, shards = shape.hidden, layout.shards
    if config.lora:
        adapters = shape.lora_adapters(config.lora_rank, config.lora_target_modules)
        norms = (2 * shape.layers + 1) * h
        saved_copy = 0 if shape.tied else shape.embedding  # PEFT's modules_to_save keeps the original beside the copy
        trainable = adapters + norms + saved_copy
        weights_count = shape.params + trainable
    else:
        trainable, weights_count = shape.params, shape.params

    terms: dict[str, int] = {}
    terms["weights"] = 4 * weights_count // shards
    terms["optimizer"] = 8 * trainable // shards
    terms["gradients"] = 4 * trainable // shards
    if layout.strategy == "ddp" and layout.processes > 1:
        terms["gradients"] += 4 * trainable  # DDP's buckets: a flat copy of every gradient
    if shards > 1:  # two layers (running, prefetched) and the embedding/head unit gathered, with their gradients
        gathered_bytes = 2 if layout.bf16 else 4
        terms["gathered"] = gathered_bytes * (4 * shape.layer + shape.embedding)
    if layout.bf16 and shards == 1 and not config.lora:
        terms["weights"] += 2 * weights_count  # autocast's bf16 copies of the trained weights, cached in the forward
    return trainable, terms


def _activation_bytes(
    shape: ModelShape, config: TrainConfig, layout: Layout, tokens: int, window: int
) -> tuple[int, int, int]:
    """``(layers_saved, layer_working, stored)``: every layer's checkpoint, one layer's working set, what is kept."""
    act = 2 if layout.bf16 else 4
    # The residual stream stays fp32 under autocast over fp32 weights and is bf16 only where the
    # parameters themselves are.
    residual = 2 if layout.bf16 and layout.shards > 1 else 4
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    layers_saved = shape.layers * tokens * h * residual if config.activation_checkpointing else 0
    # One layer's saved tensors and its backward's temporaries, per token: norm outputs, q, rotated q/k, k, v,
    # attention output and its o_proj, the gate/up/activation/product of the MLP and their gradients.
    layer_working = tokens * (LAYER_HIDDEN * h + LAYER_KV * kv + LAYER_INTERMEDIATE * shape.intermediate) * act
    if config.attn_implementation == "eager":  # the [heads, window, window] scores, their softmax and its gradient
        layer_working += 3 * (shape.heads // config.sp_size) * window * window * config.micro_batch_size * act
    if config.activation_checkpointing:
        stored = 2 * tokens * h * residual if (config.activation_offload and layout.device != "cpu") else layers_saved
    else:
        stored = shape.layers * layer_working
    return layers_saved, layer_working, stored


def _moments(
    shape: ModelShape,
    config: TrainConfig,
    layout: Layout,
    terms: dict[str, int],
    trainable: int,
    tokens: int,
    *,
    stored: int,
    layer_working: int,
    head_grad: int,
) -> dict[str, int]:
    """The bytes alive at each worst moment: the end of the forward, the backward, the optimizer step, loading.

    Args:
        terms: the terms so far (`_parameter_terms`, activations, loss).
        stored: what the forward keeps for the backward; layer_working: one layer's working set
            (both from `_activation_bytes`).
        head_grad: the bytes of the head's gradient that chunked loss computes early.
    """
    shards = layout.shards
    act = 2 if layout.bf16 else 4
    head_trained = _head_trained(shape, config)
    largest = max(
        shape.embedding if head_trained else 0, shape.hidden * max(shape.intermediate, shape.heads * shape.head_dim), 1
    )
    optimizer_temporaries = (8 * largest if layout.device == "cpu" else 4 * trainable) // shards
    static = terms["weights"] + terms["optimizer"] + terms.get("gathered", 0)
    layer_grads = terms["gradients"] - head_grad // shards
    processes = max(layout.processes // config.sp_size, 1)
    accumulating = config.global_batch_size // (config.micro_batch_size * processes) > 1
    held_grads = terms["gradients"] if accumulating else 0
    return {
        "forward": static + held_grads + stored + terms["loss"],
        "backward": static
        + held_grads
        + head_grad
        + tokens * shape.hidden * act
        + (stored + layer_grads if accumulating else max(stored, layer_grads))
        + layer_working,
        "optimizer step": static + terms["gradients"] + optimizer_temporaries,
        # the loading process holds the fp32 checkpoint whole, as read, before it is sharded
        "loading": 4 * shape.params + (4 * shape.params // shards if shards > 1 else 0),
    }


def longest_fit(
    shape: ModelShape, config: TrainConfig, layout: Layout, memory_bytes: int, multiple: int = 128
) -> int | None:
    """The longest ``seq_len`` (a multiple of ``multiple``) whose peak fits ``memory_bytes``; None if none does.

    Memory grows with the length (never shrinks), so a bisection over the multiples finds it. The
    model's own context limit (``factor x original context`` for RoPE methods) bounds the search.
    """
    low, high = SEARCH_RANGE[0] // multiple, SEARCH_RANGE[1] // multiple

    def peak(units: int) -> int:
        try:
            return estimate_memory(shape, config, layout, units * multiple).peak_bytes
        except ValueError:
            return memory_bytes + 1  # beyond what the model takes: treated as not fitting

    # bisect over the lengths 'low..high' by whether each does not fit
    index = bisect.bisect_left(range(low, high + 1), True, key=lambda units: peak(units) > memory_bytes)
    return None if index == 0 else (low + index - 1) * multiple


def step_flops(shape: ModelShape, config: TrainConfig, tokens: int, window: int) -> float:
    """FLOPs of one micro-batch's forward and backward (with the recomputation of checkpointing)."""
    matmul = 2 * (shape.params - (0 if shape.tied else shape.embedding)) * tokens  # the embedding is a lookup
    attention = 2 * shape.layers * shape.heads * shape.head_dim * window * tokens  # causal: half of 4 s^2 d
    forward = matmul + attention
    passes = 3 + (1 if config.activation_checkpointing else 0)  # forward, backward (2x), recomputation
    if config.lora:
        passes -= 1  # the frozen weights' own gradients are never computed
    return forward * passes


def tokens_per_second(shape: ModelShape, config: TrainConfig, estimate: MemoryEstimate, flops_per_s: float) -> float:
    """Training tokens per second of one process at a sustained ``flops_per_s``."""
    return estimate.tokens / (step_flops(shape, config, estimate.tokens, estimate.window) / flops_per_s)
