"""The fine-tune recipe's settings: one dataclass, filled from defaults, a YAML file and flags.

Defaults are the YaRN paper's recipe (arXiv 2309.00071, section 4): 400 steps at lr 2e-5 with
20 warm-up steps then linear decay, AdamW betas (0.9, 0.95), no weight decay, a global batch of
64 sequences through gradient accumulation, bf16 where the hardware has it, and activation
checkpointing. A YAML file (``--config``) takes the same keys as the flags, with ``-`` or
``_``; flags given on the command line win over the file::

    # examples/finetune_tiny.yaml
    model: out/tiny-llama
    method: yarn
    factor: 4
    dataset: [notes.txt, more.jsonl]
    max-train-steps: 20

Every value is checked in ``__post_init__``, before a model or a dataset is touched, so a bad
run fails at once with a message naming the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..methods import make_method, method_class

Scheduler = Literal["linear", "constant"]
MixedPrecision = Literal["auto", "no", "bf16", "fp16"]

SCHEDULERS = ("linear", "constant")
MIXED_PRECISIONS = ("auto", "no", "bf16", "fp16")
SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
REPORT_TO = ("none", "tensorboard", "wandb", "all")


@dataclass
class TrainConfig:
    """Everything one fine-tune run needs.

    Args:
        model: a Hub id or local checkpoint folder with a tokenizer.
        method: a position method from :func:`hf_posext.available_methods` (``yarn``...).
        factor: the context scale ``s``; the model is trained for ``s * L_orig`` tokens.
        output_dir: where the final checkpoint is written (atomically).
        dataset: an HF dataset name, or local ``.txt``/``.jsonl`` files, folders or globs.
        dataset_split: the split of an HF dataset.
        text_field: the text column of a ``.jsonl`` file or an HF dataset.
        seq_len: the trained context; default ``factor * L_orig``.
        max_train_steps: optimizer steps (the paper: 400).
        learning_rate: peak learning rate (the paper: 2e-5).
        lr_scheduler: ``linear`` (warm-up then linear decay to 0) or ``constant`` (after warm-up).
        warmup_steps: linear warm-up steps (the paper: 20).
        adam_beta1, adam_beta2, adam_epsilon, weight_decay: AdamW settings (paper: 0.9, 0.95, -, 0).
        max_grad_norm: gradient clipping; 0 turns it off.
        global_batch_size: sequences per optimizer step over all processes (the paper: 64).
        micro_batch_size: sequences per forward on one process; the rest is gradient accumulation.
        mixed_precision: ``auto`` = bf16 where the accelerator supports it, else fp32.
        activation_checkpointing: recompute layer activations in the backward pass.
        attn_implementation: transformers attention backend (``sdpa``, ``flash_attention_2``, ``eager``).
        lora: train LoRA adapters plus embeddings and norms (LongLoRA) and merge them on save.
        lora_rank, lora_alpha, lora_dropout: LoRA settings.
        lora_target_modules: the linear layers LoRA adapts.
        pose: positional skip-wise training (PoSE): a ``pose_window`` of tokens with position ids
            spread over ``seq_len``.
        pose_window: tokens per PoSE sample; default the model's original context.
        pose_chunks: chunks of a PoSE sample (the paper: 2).
        checkpointing_steps: save the full training state every N steps (0: never).
        checkpoint_dir: where training states go; default ``<output_dir>-checkpoints``.
        checkpoints_total_limit: keep only the newest N training states (0: keep all).
        resume: ``latest`` (or True) continues from the newest training state in
            ``checkpoint_dir``; a path continues from that one; None starts afresh.
        cache_dir: tokenized-data cache; default ``$HF_POSEXT_CACHE`` or ``~/.cache/hf_posext``.
        eval_blocks: blocks of data held out and scored before and after training (0: none).
        seed: seed of data order, PoSE positions and LoRA initialisation.
        save_dtype: dtype of the saved weights; ``auto`` = the base checkpoint's.
        report_to: accelerate tracker (``tensorboard``, ``wandb``) or ``none``.
        method_kwargs: extra arguments of the method (``beta_fast`` for YaRN...).
    """

    model: str = ""
    method: str = "yarn"
    factor: float = 16.0
    output_dir: str = ""
    dataset: list[str] = field(default_factory=list)
    dataset_split: str = "train"
    text_field: str = "text"
    seq_len: int | None = None
    max_train_steps: int = 400
    learning_rate: float = 2e-5
    lr_scheduler: Scheduler = "linear"
    warmup_steps: int = 20
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    global_batch_size: int = 64
    micro_batch_size: int = 1
    mixed_precision: MixedPrecision = "auto"
    activation_checkpointing: bool = True
    attn_implementation: str = "sdpa"
    lora: bool = False
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    pose: bool = False
    pose_window: int | None = None
    pose_chunks: int = 2
    checkpointing_steps: int = 0
    checkpoint_dir: str | None = None
    checkpoints_total_limit: int = 2
    resume: str | None = None
    cache_dir: str | None = None
    eval_blocks: int = 0
    seed: int = 42
    save_dtype: str = "auto"
    report_to: str = "none"
    method_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.dataset, (str, os.PathLike)):
            self.dataset = [str(self.dataset)]
        self.dataset = [str(item) for item in self.dataset]
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [name.strip() for name in self.lora_target_modules.split(",") if name.strip()]
        if self.resume is True:
            self.resume = "latest"
        elif self.resume is False:
            self.resume = None
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad setting and what is allowed."""
        if not self.model:
            raise ValueError("model is required: a Hub id or a local checkpoint folder (--model)")
        if not self.output_dir:
            raise ValueError("output_dir is required: the folder the fine-tuned checkpoint is written to (--output-dir)")
        if not self.dataset:
            raise ValueError("dataset is required: an HF dataset name or local .txt/.jsonl files (--dataset)")
        method_class(self.method)  # raises ValueError naming the known methods
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)) or not math.isfinite(self.factor):
            raise ValueError(f"factor must be a finite number >= 1, got {self.factor!r}")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1 (the context scale s), got {self.factor!r}")
        _positive("max_train_steps", self.max_train_steps)
        _positive("global_batch_size", self.global_batch_size)
        _positive("micro_batch_size", self.micro_batch_size)
        _positive("pose_chunks", self.pose_chunks)
        for name in ("seq_len", "pose_window"):
            value = getattr(self, name)
            if value is not None:
                _positive(name, value, minimum=2)
        for name in ("warmup_steps", "checkpointing_steps", "checkpoints_total_limit", "eval_blocks", "lora_rank",
                     "lora_alpha", "seed"):
            _positive(name, getattr(self, name), minimum=1 if name == "lora_rank" else 0)
        if self.warmup_steps > self.max_train_steps:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} exceeds max_train_steps={self.max_train_steps}; "
                "use at most max_train_steps warm-up steps"
            )
        for name in ("learning_rate", "adam_epsilon"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("adam_beta1", "adam_beta2", "lora_dropout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("weight_decay", "max_grad_norm"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        _choice("lr_scheduler", self.lr_scheduler, SCHEDULERS)
        _choice("mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        _choice("save_dtype", self.save_dtype, SAVE_DTYPES)
        _choice("report_to", self.report_to, REPORT_TO)
        if not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty; name the linear layers LoRA adapts, e.g. q_proj,v_proj")
        if self.pose and self.seq_len is not None and self.pose_window is not None and self.pose_window > self.seq_len:
            raise ValueError(
                f"pose_window={self.pose_window} exceeds seq_len={self.seq_len}: PoSE trains a short window "
                "with positions spread over the longer seq_len"
            )
        if not isinstance(self.method_kwargs, dict):
            raise ValueError(f"method_kwargs must be a mapping of method arguments, got {self.method_kwargs!r}")
        # The method's own checks (ALiBi takes factor 1 only, unknown arguments...), before any model loads.
        make_method(self.method, factor=self.factor, **self.method_kwargs)

    @property
    def checkpoint_path(self) -> Path:
        """The folder training states are saved to and resumed from."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(f"{self.output_dir}-checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build a config from ``values`` whose keys may use ``-`` or ``_``.

        Raises:
            ValueError: for a key that is no setting, listing the settings.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        normalized = {str(key).replace("-", "_"): value for key, value in values.items()}
        unknown = sorted(set(normalized) - known)
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {unknown}; the settings are: {', '.join(sorted(known))}")
        return cls(**normalized)


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML config file (keys as in the flags).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file does not hold a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(values).__name__}")
    return values


def _positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
