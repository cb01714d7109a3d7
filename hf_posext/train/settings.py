"""The fine-tune recipe's settings in eight groups, each a dataclass: model, method, data, schedule,
optimisation, distribution, checkpointing, evaluation.

Each field is one setting: its flag (``seq_len`` -> ``--seq-len``), its YAML key, its help text and its
check (`setting`'s ``check``, a `hf_posext.validation` check run once, when a `TrainConfig` is built).
What one field cannot check alone (a warm-up longer than the run, PoSE with packing...) is its group's
``check_together``. ``hf-posext finetune --help`` lists the flags under these groups (``HfArgumentParser``
parses them, `hf_posext.commands.finetune`); `hf_posext.train.config.TrainConfig` is all of them in one
object, as the recipe reads them (``config.seq_len``). Defaults are the YaRN paper's recipe (arXiv
2309.00071, section 4). Longer than ~400 lines: the help texts are the flags' documentation.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import SchedulerType, get_scheduler

from ..integration import HfArg
from ..methods import available_methods, method_class, method_config, split_method_kwargs, training_for
from ..validation import (
    Check,
    anything,
    choice,
    integer,
    mapping,
    number,
    optional,
    real_number,
    required,
)
from .conversations import LOSS_ON, LossOn
from .schedule import SCHEDULES

#: transformers.get_scheduler's schedules that step on the step count alone (not reduce_lr_on_plateau
#: or greedy, which step on a metric); ``constant`` keeps the peak after the warm-up.
SCHEDULERS = tuple(
    kind.value for kind in SchedulerType if kind not in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)
)
MIXED_PRECISIONS = ("auto", "no", "bf16", "fp16")
SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
REPORT_TO = ("none", "tensorboard", "wandb", "all")
#: The recipe's context scale when none is given, for the methods that take one (the YaRN paper's 16).
DEFAULT_FACTOR = 16.0
#: The YaRN paper's warm-up (20 steps); a run shorter than 200 steps warms up for a tenth of its steps.
DEFAULT_WARMUP_STEPS = 20
#: The metadata key a field's check is declared under (`setting`) until `_take_checks` moves it to `CHECKS`.
_CHECK = "check"
# Literal types give the flags their choices (HfArgumentParser reads them).
Scheduler = Literal[SCHEDULERS]
MixedPrecision = Literal[MIXED_PRECISIONS]
SaveDtype = Literal[SAVE_DTYPES]
ReportTo = Literal[REPORT_TO]
WindowScheduleKind = Literal[SCHEDULES]


def setting(*, check: Check, **kwargs: Any) -> Any:
    """A settings field: ``HfArg(**kwargs)`` (default, help, aliases...) declared with its ``check``.

    The check is declared beside the field and kept in `CHECKS` (`_take_checks`), not in the field's metadata:
    ``HfArgumentParser`` hands all metadata to ``argparse.add_argument``, which takes no ``check``.
    """
    metadata = {**kwargs.pop("metadata", {}), _CHECK: check}
    return HfArg(metadata=metadata, **kwargs)


def _training_options_help() -> str:
    """The registered methods' training options, for ``--set``'s help (``longrope: factors=mixed|long``)."""
    listed = [
        f"{name}: {option.name}={'|'.join(option.choices)} (default {option.default})"
        for name in available_methods()
        for option in training_for(name).options
    ]
    return "; ".join(listed) or "none registered"


def _factor(name: str, value: Any) -> float:
    factor = real_number("", name, value, ">= 1")
    if factor < 1:
        raise ValueError(f"{name} must be >= 1 (the context scale s), got {value!r}")
    return value


def _method(name: str, value: Any) -> str:
    method_class(value)  # raises ValueError naming the known methods
    return value


def _target_modules(name: str, value: Any) -> list[str]:
    if not value:
        raise ValueError(f"{name} is empty; name the linear layers LoRA adapts, e.g. q_proj,v_proj")
    return value


@dataclass
class ModelSettings:
    """The model settings: the base model and what of it is trained."""

    _argument_group_name = "model"
    model: str = setting(
        check=required("a Hub id or a local checkpoint folder (--model)"),
        default="",
        help="a Hub id or local checkpoint folder with a tokenizer, or a local .gguf file",
    )
    attn_implementation: str = setting(
        check=anything, default="sdpa", help="transformers attention backend (sdpa, flash_attention_2, eager)"
    )
    lora: bool = setting(
        check=anything,
        default=False,
        help="train LoRA adapters plus embeddings and norms (LongLoRA) and merge them on save",
    )
    lora_rank: int = setting(check=integer(1), default=8, help="LoRA r")
    lora_alpha: int = setting(check=integer(0), default=16, help="LoRA alpha")
    lora_dropout: float = setting(check=number(0, 1, high_open=True), default=0.0, help="LoRA dropout")
    lora_target_modules: list[str] = setting(
        check=_target_modules,
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        help="the linear layers LoRA adapts",
    )


@dataclass
class MethodSettings:
    """The method settings: the position method the model is patched with."""

    _argument_group_name = "method"
    method: str = setting(check=_method, default="yarn", help="a position method from hf_posext.available_methods()")
    factor: float | None = setting(
        check=optional(_factor),
        default=None,
        help=f"the context scale s; the model is trained for s * L_orig tokens; default {DEFAULT_FACTOR:g} "
        "(the YaRN paper's), 1 for the methods that take no factor (alibi, sinusoidal, learned)",
    )
    method_kwargs: dict[str, Any] = setting(
        check=mapping("a mapping of method arguments"),
        default_factory=dict,
        aliases=["--set", "--method-arg"],
        help="an argument of the method, e.g. beta_fast=32, or one of its training options (what the recipe does "
        f"for it: {_training_options_help()}) (repeatable; --method-arg is the old name)",
    )

    def check_together(self) -> None:
        """The factor's default for the method, and the method's own checks (ALiBi takes factor 1 only,
        unknown arguments, its training options' values...), before any model loads."""
        if self.factor is None:  # a default nobody typed must not be refused by a method that takes no factor
            self.factor = DEFAULT_FACTOR if method_class(self.method).takes_factor else 1.0
        if "factor" in self.method_kwargs:
            raise ValueError(
                f"method_kwargs (--set) sets factor={self.method_kwargs['factor']!r}; factor has its own setting: "
                f"--factor {self.method_kwargs['factor']} (or factor: in the YAML file)"
            )
        method_config(self.method, factor=self.factor, **self.method_arguments)

    @property
    def method_arguments(self) -> dict[str, Any]:
        """``method_kwargs`` less the method's training options: the arguments of its config."""
        return split_method_kwargs(self.method, self.method_kwargs)[0]

    @property
    def training_options(self) -> dict[str, str]:
        """The method's training options (`hf_posext.methods.training`): ``--set``'s, defaults filled in."""
        return split_method_kwargs(self.method, self.method_kwargs)[1]


@dataclass
class DataSettings:
    """The data settings: what the model reads, and how it is cut into sequences."""

    _argument_group_name = "data"
    dataset: list[str] = setting(
        check=required("an HF dataset name or local .txt/.jsonl files (--dataset)"),
        default_factory=list,
        help="an HF dataset name, or local .txt/.jsonl files, folders or globs, or stdlib",
    )
    dataset_split: str = setting(check=anything, default="train", help="the split of an HF dataset")
    text_field: str = setting(check=anything, default="text", help="the text column of a .jsonl file or an HF dataset")
    packing: bool = setting(
        check=anything,
        default=False,
        help="several whole documents per sequence, each at its own positions (0, 1, ...) and attending only to "
        "itself, instead of the text cut into blocks that run across documents; data holding conversations "
        "(messages or ShareGPT conversations) is always trained packed",
    )
    loss_on: LossOn = setting(
        check=choice(LOSS_ON),
        default="assistant",
        help="a conversation's trained tokens: its assistant turns (the content and end of turn the chat template "
        "writes), or all its tokens",
    )
    chat_template: str | None = setting(
        check=anything, default=None, help="a Jinja chat template file for conversations; default the tokenizer's own"
    )
    skip_bad_records: bool = setting(
        check=anything,
        default=False,
        help="count and leave out bad records (no messages or text, unknown roles, empty or missing assistant "
        "turns, malformed ShareGPT) instead of stopping at the first; the counts go into train_results.json",
    )
    seq_len: int | None = setting(
        check=optional(integer(2)), default=None, help="the trained context; default factor * L_orig"
    )
    pose: bool = setting(
        check=anything,
        default=False,
        help="positional skip-wise training (PoSE): a pose_window of tokens with position ids spread over seq_len",
    )
    pose_window: int | None = setting(
        check=optional(integer(2)), default=None, help="tokens per PoSE sample; default the model's original context"
    )
    pose_chunks: int = setting(check=integer(1), default=2, help="chunks of a PoSE sample (the paper: 2)")
    short_fraction: float = setting(
        check=number(0, 1, high_open=True),
        default=0.0,
        help="the long/short mix (ProLong): this fraction of the micro-batches, evenly spread, holds whole short "
        "documents at their own length and positions instead of a long sample; keeps short prompts untaxed "
        "(0: off; a method may train the short side its own way: its training options, --set)",
    )
    short_seq_len: int | None = setting(
        check=optional(integer(2)),
        default=None,
        help="tokens of a short micro-batch: documents of at most this many tokens, packed whole; "
        "default the original context or the training window, whichever is shorter",
    )
    short_dataset: list[str] = setting(
        check=anything,
        default_factory=list,
        help="where the short documents come from (as dataset); default the dataset itself",
    )
    cache_dir: str | None = setting(
        check=anything, default=None, help="tokenized-data cache; default $HF_POSEXT_CACHE or ~/.cache/hf_posext"
    )

    def check_together(self) -> None:
        """PoSE's window inside the trained context, and PoSE or packing, not both."""
        if self.pose and self.seq_len is not None and self.pose_window is not None and self.pose_window > self.seq_len:
            raise ValueError(
                f"pose_window={self.pose_window} exceeds seq_len={self.seq_len}: PoSE trains a short window "
                "with positions spread over the longer seq_len"
            )
        if self.packing and self.pose:
            raise ValueError(
                "packing keeps every document at its own positions (0, 1, ...), PoSE spreads one window's positions "
                "over seq_len: use one of them (packing=False, or pose=False)"
            )


@dataclass
class ScheduleSettings:
    """The schedule settings: how long the run is and how the learning rate and window change over it."""

    _argument_group_name = "schedule"
    max_train_steps: int = setting(check=integer(1), default=400, help="optimizer steps (the paper: 400)")
    lr_scheduler: Scheduler = setting(
        check=choice(SCHEDULERS),
        default="linear",
        help="transformers.get_scheduler's schedule after the warm-up: linear decay to 0 (the paper), constant "
        "(transformers' constant_with_warmup), cosine, warmup_stable_decay...",
    )
    lr_scheduler_kwargs: dict[str, Any] = setting(
        check=mapping(),
        default_factory=dict,
        help="extra arguments of the schedule, e.g. min_lr_rate=0.1 for cosine_with_min_lr (repeatable)",
    )
    warmup_steps: int | None = setting(
        check=optional(integer(0)),
        default=None,
        help=f"linear warm-up steps (default: the paper's {DEFAULT_WARMUP_STEPS}, or a tenth of a shorter run)",
    )
    window_schedule: WindowScheduleKind = setting(
        check=choice(SCHEDULES),
        default="none",
        help="grow the window of the long micro-batches (the PoSE window, or the sequence without PoSE) with the "
        "optimizer step, short to long (SkyLadder): linear, or step (doubling stages), from window_start to the full "
        "window at window_ramp_steps; none: the full window from step 1. Use it when long windows are costly: the "
        "early steps are cheaper and the rest of the run trains the full window",
    )
    window_start: int | None = setting(
        check=optional(integer(2)),
        default=None,
        help="the first step's window with a window_schedule; default a quarter of the full window",
    )
    window_ramp_steps: int | None = setting(
        check=optional(integer(1)),
        default=None,
        help="optimizer steps over which the window grows to its full length; default half of max_train_steps",
    )

    def check_together(self) -> None:
        """The warm-up's default and length, the schedule's own arguments, and the window schedule."""
        if self.warmup_steps is None:  # a default nobody typed must not refuse a short run
            self.warmup_steps = min(DEFAULT_WARMUP_STEPS, self.max_train_steps // 10)
        if self.warmup_steps > self.max_train_steps:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} exceeds max_train_steps={self.max_train_steps}; "
                "use at most max_train_steps warm-up steps"
            )
        try:  # a throwaway optimizer: the schedule's own checks (missing or unknown arguments), now
            build_scheduler(self, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"lr_scheduler={self.lr_scheduler!r} with lr_scheduler_kwargs={self.lr_scheduler_kwargs!r}: {err}"
            ) from None
        shaping = [name for name in ("window_start", "window_ramp_steps") if getattr(self, name) is not None]
        if self.window_schedule == "none" and shaping:
            raise ValueError(
                f"window_start and window_ramp_steps shape a window_schedule, which is none ({', '.join(shaping)} "
                "given): set window_schedule to linear or step, or leave them out"
            )
        if self.window_schedule != "none" and self.max_train_steps < 2:
            raise ValueError(
                f"window_schedule={self.window_schedule} needs max_train_steps >= 2 (got {self.max_train_steps}): "
                "the window grows over the run and the full one is trained from the step the ramp ends"
            )
        # step i (0-based) trains the full window from i = window_ramp_steps on: the last step, max_train_steps - 1,
        # must reach it (a ramp equal to the run trained 16, 53, 90 of 128 tokens and never the full window)
        if self.window_ramp_steps is not None and self.window_ramp_steps >= self.max_train_steps:
            raise ValueError(
                f"window_ramp_steps={self.window_ramp_steps} with max_train_steps={self.max_train_steps}: the full "
                f"window would never be trained (the window reaches it after the ramp's last step); use at most "
                f"{self.max_train_steps - 1}"
            )


@dataclass
class OptimisationSettings:
    """The optimisation settings: the optimizer and what a step costs in memory."""

    _argument_group_name = "optimisation"
    learning_rate: float = setting(
        check=number(0, low_open=True), default=2e-5, help="peak learning rate (the paper: 2e-5)"
    )
    adam_beta1: float = setting(check=number(0, 1, high_open=True), default=0.9, help="AdamW beta1 (the paper: 0.9)")
    adam_beta2: float = setting(check=number(0, 1, high_open=True), default=0.95, help="AdamW beta2 (the paper: 0.95)")
    adam_epsilon: float = setting(check=number(0, low_open=True), default=1e-8, help="AdamW epsilon")
    weight_decay: float = setting(check=number(0), default=0.0, help="AdamW weight decay (the paper: 0)")
    max_grad_norm: float = setting(check=number(0), default=1.0, help="gradient clipping; 0 turns it off")
    activation_checkpointing: bool = setting(
        check=anything, default=True, help="recompute layer activations in the backward pass"
    )
    activation_offload: bool = setting(
        check=anything,
        default=False,
        help="GPU only: checkpointed activations wait in pinned host memory, not on the device "
        "(transformers' offload); refused on CPU, where it would only add copies",
    )
    loss_chunk_size: int = setting(
        check=integer(0),
        default=1024,
        help="tokens whose logits exist at once in the loss (train/loss.py); "
        "0 = the model's own loss, which materialises [tokens x vocabulary] fp32 logits",
    )
    seed: int = setting(check=integer(0), default=42, help="seed of data order, PoSE positions and LoRA initialisation")

    def check_together(self) -> None:
        """Activation offload moves checkpointed activations: it needs activation checkpointing."""
        if self.activation_offload and not self.activation_checkpointing:
            raise ValueError(
                "activation_offload offloads the checkpointed activations: it needs activation_checkpointing=True"
            )


@dataclass
class DistributionSettings:
    """The distribution settings: the batch over processes, sequence parallelism and precision."""

    _argument_group_name = "distribution"
    global_batch_size: int = setting(
        check=integer(1), default=64, help="sequences per optimizer step over all processes (the paper: 64)"
    )
    micro_batch_size: int = setting(
        check=integer(1), default=1, help="sequences per forward on one process; the rest is gradient accumulation"
    )
    sp_size: int = setting(
        check=integer(1),
        default=1,
        help="sequence parallelism: each sequence split over this many processes, attention heads over them "
        "(DeepSpeed Ulysses through accelerate's ParallelismConfig(sp_backend='deepspeed'); GPUs with a DeepSpeed "
        "accelerate config, examples/accelerate/deepspeed_ulysses.yaml); 1: off",
    )
    mixed_precision: MixedPrecision = setting(
        check=choice(MIXED_PRECISIONS),
        default="auto",
        help="auto = the launcher's setting, else bf16 where the accelerator supports it, else fp32",
    )


@dataclass
class CheckpointSettings:
    """The checkpointing settings: where the result and the training states go."""

    _argument_group_name = "checkpointing"
    output_dir: str = setting(
        check=required("the folder the fine-tuned checkpoint is written to (--output-dir)"),
        default="",
        help="where the final checkpoint is written (atomically)",
    )
    overwrite: bool = setting(
        check=anything,
        default=False,
        help="write into a non-empty output_dir: its checkpoint files are replaced, other files kept",
    )
    save_dtype: SaveDtype = setting(
        check=choice(SAVE_DTYPES), default="auto", help="dtype of the saved weights; auto = the base checkpoint's"
    )
    checkpointing_steps: int = setting(
        check=integer(0), default=0, help="save the full training state every N steps (0: never)"
    )
    checkpoint_dir: str | None = setting(
        check=anything, default=None, help="where training states go; default <output_dir>-checkpoints"
    )
    checkpoints_total_limit: int = setting(
        check=integer(0), default=2, help="keep only the newest N training states (0: keep all)"
    )
    resume: str | None = setting(
        check=anything,
        default=None,
        help="latest (the flag alone) continues from the newest training state in checkpoint_dir; "
        "a path continues from that one",
        metadata={"nargs": "?", "const": "latest", "metavar": "PATH"},
    )


@dataclass
class EvaluationSettings:
    """The evaluation settings: what is measured during the run."""

    _argument_group_name = "evaluation"
    eval_blocks: int = setting(
        check=integer(0), default=0, help="blocks of data held out and scored before and after training (0: none)"
    )
    report_to: ReportTo = setting(
        check=choice(REPORT_TO), default="none", help="accelerate tracker (tensorboard, wandb, all) or none"
    )


#: The groups in the order ``--help`` lists them; `hf_posext.train.config.TrainConfig` is all of them.
SETTING_GROUPS: tuple[type, ...] = (
    ModelSettings,
    MethodSettings,
    DataSettings,
    ScheduleSettings,
    OptimisationSettings,
    DistributionSettings,
    CheckpointSettings,
    EvaluationSettings,
)


def _take_checks(groups: tuple[type, ...]) -> dict[str, Check]:
    """Each field's check (`setting`), by field name, taken out of the field's metadata."""
    checks = {}
    for group in groups:
        for field in dataclasses.fields(group):
            metadata = dict(field.metadata)
            checks[field.name] = metadata.pop(_CHECK)
            field.metadata = types.MappingProxyType(metadata)
    return checks


#: Each setting's check (`hf_posext.validation`), by field name, as `setting` declared it.
CHECKS: dict[str, Check] = _take_checks(SETTING_GROUPS)


def build_scheduler(config: ScheduleSettings, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """``config``'s learning-rate schedule on ``optimizer``, through ``transformers.get_scheduler``."""
    # The recipe's "constant" has always meant: warm up, then hold (transformers' plain
    # "constant" ignores the warm-up).
    name = "constant_with_warmup" if config.lr_scheduler == "constant" else config.lr_scheduler
    return get_scheduler(
        name,
        optimizer,
        num_warmup_steps=config.warmup_steps,
        num_training_steps=config.max_train_steps,
        scheduler_specific_kwargs=dict(config.lr_scheduler_kwargs),
    )
