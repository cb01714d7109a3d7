"""The fine-tune recipe's settings: one dataclass, filled from defaults, a YAML file and flags.

Defaults are the YaRN paper's recipe (arXiv 2309.00071, section 4); every value is checked in
``__post_init__`` before a model or dataset is touched (docs/notes/training.md). Longer than ~400 lines:
the flags are this dataclass's fields with their help texts, and each field's check sits beside them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from transformers import SchedulerType, get_scheduler

from ..integration import HfArg
from ..methods import available_methods, method_class, method_config, split_method_kwargs, training_for
from ..methods.training import old_training_settings
from ..validation import (
    Check,
    anything,
    choice,
    integer,
    mapping,
    number,
    optional,
    parse_bool,
    real_number,
    required,
)
from .conversations import LOSS_ON, LossOn
from .old_settings import take_old_settings
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
#: Field types read from text by their flag's parser; a YAML string value is read the same way.
_NUMBER_TYPES: dict[Any, type] = {int: int, float: float, int | None: int, float | None: float}
# Literal types give the flags their choices (HfArgumentParser reads them).
Scheduler = Literal[SCHEDULERS]
MixedPrecision = Literal[MIXED_PRECISIONS]
SaveDtype = Literal[SAVE_DTYPES]
ReportTo = Literal[REPORT_TO]
WindowScheduleKind = Literal[SCHEDULES]


def _training_options_help() -> str:
    """The registered methods' training options, for ``--set``'s help (``longrope: factors=mixed|long``)."""
    listed = [
        f"{name}: {option.name}={'|'.join(option.choices)} (default {option.default})"
        for name in available_methods()
        for option in training_for(name).options
    ]
    return "; ".join(listed) or "none registered"


def _reads_old_settings(cls: type) -> type:
    """``cls`` (a dataclass) whose constructor also takes the old settings of `old_settings` (warned, moved)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        default_method = cls.__dataclass_fields__["method"].default  # type: ignore[attr-defined]
        init(self, *args, **take_old_settings(kwargs, default_method))

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


@_reads_old_settings
@dataclass
class TrainConfig:
    """Everything one fine-tune run needs; each field's ``help`` is its documentation.

    The help texts are what ``hf-posext finetune --help`` prints (through
    ``transformers.HfArgumentParser``, `hf_posext.commands.finetune`), so code and flags cannot drift apart.
    """

    model: str = HfArg(default="", help="a Hub id or local checkpoint folder with a tokenizer, or a local .gguf file")
    method: str = HfArg(default="yarn", help="a position method from hf_posext.available_methods()")
    factor: float | None = HfArg(
        default=None,
        help=f"the context scale s; the model is trained for s * L_orig tokens; default {DEFAULT_FACTOR:g} "
        "(the YaRN paper's), 1 for the methods that take no factor (alibi, sinusoidal, learned)",
    )
    output_dir: str = HfArg(default="", help="where the final checkpoint is written (atomically)")
    overwrite: bool = HfArg(
        default=False, help="write into a non-empty output_dir: its checkpoint files are replaced, other files kept"
    )
    dataset: list[str] = HfArg(
        default_factory=list, help="an HF dataset name, or local .txt/.jsonl files, folders or globs, or stdlib"
    )
    dataset_split: str = HfArg(default="train", help="the split of an HF dataset")
    text_field: str = HfArg(default="text", help="the text column of a .jsonl file or an HF dataset")
    packing: bool = HfArg(
        default=False,
        help="several whole documents per sequence, each at its own positions (0, 1, ...) and attending only to "
        "itself, instead of the text cut into blocks that run across documents; data holding conversations "
        "(messages or ShareGPT conversations) is always trained packed",
    )
    loss_on: LossOn = HfArg(
        default="assistant",
        help="a conversation's trained tokens: its assistant turns (the content and end of turn the chat template "
        "writes), or all its tokens",
    )
    chat_template: str | None = HfArg(
        default=None, help="a Jinja chat template file for conversations; default the tokenizer's own"
    )
    skip_bad_records: bool = HfArg(
        default=False,
        help="count and leave out bad records (no messages or text, unknown roles, empty or missing assistant "
        "turns, malformed ShareGPT) instead of stopping at the first; the counts go into train_results.json",
    )
    seq_len: int | None = HfArg(default=None, help="the trained context; default factor * L_orig")
    max_train_steps: int = HfArg(default=400, help="optimizer steps (the paper: 400)")
    learning_rate: float = HfArg(default=2e-5, help="peak learning rate (the paper: 2e-5)")
    lr_scheduler: Scheduler = HfArg(
        default="linear",
        help="transformers.get_scheduler's schedule after the warm-up: linear decay to 0 (the paper), constant "
        "(transformers' constant_with_warmup), cosine, warmup_stable_decay...",
    )
    lr_scheduler_kwargs: dict[str, Any] = HfArg(
        default_factory=dict,
        help="extra arguments of the schedule, e.g. min_lr_rate=0.1 for cosine_with_min_lr (repeatable)",
    )
    warmup_steps: int | None = HfArg(
        default=None,
        help=f"linear warm-up steps (default: the paper's {DEFAULT_WARMUP_STEPS}, or a tenth of a shorter run)",
    )
    adam_beta1: float = HfArg(default=0.9, help="AdamW beta1 (the paper: 0.9)")
    adam_beta2: float = HfArg(default=0.95, help="AdamW beta2 (the paper: 0.95)")
    adam_epsilon: float = HfArg(default=1e-8, help="AdamW epsilon")
    weight_decay: float = HfArg(default=0.0, help="AdamW weight decay (the paper: 0)")
    max_grad_norm: float = HfArg(default=1.0, help="gradient clipping; 0 turns it off")
    global_batch_size: int = HfArg(default=64, help="sequences per optimizer step over all processes (the paper: 64)")
    micro_batch_size: int = HfArg(
        default=1, help="sequences per forward on one process; the rest is gradient accumulation"
    )
    mixed_precision: MixedPrecision = HfArg(
        default="auto", help="auto = the launcher's setting, else bf16 where the accelerator supports it, else fp32"
    )
    activation_checkpointing: bool = HfArg(default=True, help="recompute layer activations in the backward pass")
    activation_offload: bool = HfArg(
        default=False,
        help="GPU only: checkpointed activations wait in pinned host memory, not on the device "
        "(transformers' offload); refused on CPU, where it would only add copies",
    )
    loss_chunk_size: int = HfArg(
        default=1024,
        help="tokens whose logits exist at once in the loss (train/loss.py); "
        "0 = the model's own loss, which materialises [tokens x vocabulary] fp32 logits",
    )
    attn_implementation: str = HfArg(
        default="sdpa", help="transformers attention backend (sdpa, flash_attention_2, eager)"
    )
    lora: bool = HfArg(
        default=False, help="train LoRA adapters plus embeddings and norms (LongLoRA) and merge them on save"
    )
    lora_rank: int = HfArg(default=8, help="LoRA r")
    lora_alpha: int = HfArg(default=16, help="LoRA alpha")
    lora_dropout: float = HfArg(default=0.0, help="LoRA dropout")
    lora_target_modules: list[str] = HfArg(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], help="the linear layers LoRA adapts"
    )
    pose: bool = HfArg(
        default=False,
        help="positional skip-wise training (PoSE): a pose_window of tokens with position ids spread over seq_len",
    )
    pose_window: int | None = HfArg(default=None, help="tokens per PoSE sample; default the model's original context")
    pose_chunks: int = HfArg(default=2, help="chunks of a PoSE sample (the paper: 2)")
    short_fraction: float = HfArg(
        default=0.0,
        help="the long/short mix (ProLong): this fraction of the micro-batches, evenly spread, holds whole short "
        "documents at their own length and positions instead of a long sample; keeps short prompts untaxed "
        "(0: off; a method may train the short side its own way: its training options, --set)",
    )
    short_seq_len: int | None = HfArg(
        default=None,
        help="tokens of a short micro-batch: documents of at most this many tokens, packed whole; "
        "default the original context or the training window, whichever is shorter",
    )
    short_dataset: list[str] = HfArg(
        default_factory=list, help="where the short documents come from (as dataset); default the dataset itself"
    )
    window_schedule: WindowScheduleKind = HfArg(
        default="none",
        help="grow the window of the long micro-batches (the PoSE window, or the sequence without PoSE) with the "
        "optimizer step, short to long (SkyLadder): linear, or step (doubling stages), from window_start to the full "
        "window at window_ramp_steps; none: the full window from step 1. Use it when long windows are costly: the "
        "early steps are cheaper and the rest of the run trains the full window",
    )
    window_start: int | None = HfArg(
        default=None, help="the first step's window with a window_schedule; default a quarter of the full window"
    )
    window_ramp_steps: int | None = HfArg(
        default=None,
        help="optimizer steps over which the window grows to its full length; default half of max_train_steps",
    )
    sp_size: int = HfArg(
        default=1,
        help="sequence parallelism: each sequence split over this many processes, attention heads over them "
        "(DeepSpeed Ulysses through accelerate's ParallelismConfig(sp_backend='deepspeed'); GPUs with a DeepSpeed "
        "accelerate config, examples/accelerate/deepspeed_ulysses.yaml); 1: off",
    )
    checkpointing_steps: int = HfArg(default=0, help="save the full training state every N steps (0: never)")
    checkpoint_dir: str | None = HfArg(default=None, help="where training states go; default <output_dir>-checkpoints")
    checkpoints_total_limit: int = HfArg(default=2, help="keep only the newest N training states (0: keep all)")
    resume: str | None = HfArg(
        default=None,
        help="latest (the flag alone) continues from the newest training state in checkpoint_dir; "
        "a path continues from that one",
        metadata={"nargs": "?", "const": "latest", "metavar": "PATH"},
    )
    cache_dir: str | None = HfArg(
        default=None, help="tokenized-data cache; default $HF_POSEXT_CACHE or ~/.cache/hf_posext"
    )
    eval_blocks: int = HfArg(default=0, help="blocks of data held out and scored before and after training (0: none)")
    seed: int = HfArg(default=42, help="seed of data order, PoSE positions and LoRA initialisation")
    save_dtype: SaveDtype = HfArg(default="auto", help="dtype of the saved weights; auto = the base checkpoint's")
    report_to: ReportTo = HfArg(default="none", help="accelerate tracker (tensorboard, wandb, all) or none")
    method_kwargs: dict[str, Any] = HfArg(
        default_factory=dict,
        aliases=["--set", "--method-arg"],
        help="an argument of the method, e.g. beta_fast=32, or one of its training options (what the recipe does "
        f"for it: {_training_options_help()}) (repeatable; --method-arg is the old name)",
    )

    def __post_init__(self) -> None:
        self._read_text_values()
        if isinstance(self.dataset, (str, os.PathLike)):
            self.dataset = [str(self.dataset)]
        self.dataset = [str(item) for item in self.dataset]
        if isinstance(self.short_dataset, (str, os.PathLike)):
            self.short_dataset = [str(self.short_dataset)]
        self.short_dataset = [str(item) for item in self.short_dataset]
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [name.strip() for name in self.lora_target_modules.split(",") if name.strip()]
        if self.resume is True:
            self.resume = "latest"
        elif self.resume is False:
            self.resume = None
        self.validate()

    def _read_text_values(self) -> None:
        """Booleans and numbers given as text (YAML ``lora: "false"``, ``factor: "4"``) are read as the flags read them.

        A boolean is true/false/yes/no/1/0 in any case and nothing else (``"false"`` is not true
        because it is a non-empty string); a number in quotes is that number, as on the command line.
        """
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            setattr(self, field.name, _read_text(field.name, hints[field.name], getattr(self, field.name)))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad setting and what is allowed.

        Each field has its check in `FIELD_CHECKS` (run in field order); what no single
        field can check alone (a warm-up longer than the run, the schedule's and the method's own
        arguments...) comes after.
        """
        for field in dataclasses.fields(self):
            setattr(self, field.name, FIELD_CHECKS[field.name](field.name, getattr(self, field.name)))
        if self.factor is None:  # a default nobody typed must not be refused by a method that takes no factor
            self.factor = DEFAULT_FACTOR if method_class(self.method).takes_factor else 1.0
        if self.activation_offload and not self.activation_checkpointing:
            raise ValueError(
                "activation_offload offloads the checkpointed activations: it needs activation_checkpointing=True"
            )
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
        if self.pose and self.seq_len is not None and self.pose_window is not None and self.pose_window > self.seq_len:
            raise ValueError(
                f"pose_window={self.pose_window} exceeds seq_len={self.seq_len}: PoSE trains a short window "
                "with positions spread over the longer seq_len"
            )
        self._check_window_schedule()
        if self.packing and self.pose:
            raise ValueError(
                "packing keeps every document at its own positions (0, 1, ...), PoSE spreads one window's positions "
                "over seq_len: use one of them (packing=False, or pose=False)"
            )
        if "factor" in self.method_kwargs:
            raise ValueError(
                f"method_kwargs (--set) sets factor={self.method_kwargs['factor']!r}; factor has its own setting: "
                f"--factor {self.method_kwargs['factor']} (or factor: in the YAML file)"
            )
        # The method's own checks (ALiBi takes factor 1 only, unknown arguments, its training options' values...),
        # before any model loads.
        method_config(self.method, factor=self.factor, **self.method_arguments)

    @property
    def method_arguments(self) -> dict[str, Any]:
        """``method_kwargs`` less the method's training options: the arguments of its config."""
        return split_method_kwargs(self.method, self.method_kwargs)[0]

    @property
    def training_options(self) -> dict[str, str]:
        """The method's training options (`hf_posext.methods.training`): ``--set``'s, defaults filled in."""
        return split_method_kwargs(self.method, self.method_kwargs)[1]

    def _check_window_schedule(self) -> None:
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

    @property
    def checkpoint_path(self) -> Path:
        """The folder training states are saved to and resumed from."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(f"{self.output_dir}-checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def check_keys(cls, values: dict[str, Any], source: str = "config") -> dict[str, Any]:
        """``values`` with ``-`` in keys read as ``_``.

        Raises:
            ValueError: for a key that is no setting, listing the settings.
        """
        known = {f.name for f in dataclasses.fields(cls)} | set(old_training_settings())
        normalized = {str(key).replace("-", "_"): value for key, value in values.items()}
        unknown = sorted(set(normalized) - known)
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {unknown}; the settings are: {', '.join(sorted(known))}")
        return normalized

    @classmethod
    def check_file_values(cls, values: dict[str, Any], source: str) -> dict[str, Any]:
        """``values`` of a config file, each read and checked alone, before flags are merged in.

        Raises:
            ValueError: ``"<source>: <field> must be ..."``: the file and the field as written there.
        """
        hints = typing.get_type_hints(cls)
        checked = {}
        old = old_training_settings()
        for name, value in cls.check_keys(values, source).items():
            if name in old:  # read with the method, which the flags may still set (`take_old_settings`)
                checked[name] = value
                continue
            try:
                value = _read_text(name, hints[name], value)
                checked[name] = value if value is None else FIELD_CHECKS[name](name, value)
            except ValueError as err:
                raise ValueError(f"{source}: {err}") from None
        return checked

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build a config from ``values`` whose keys may use ``-`` or ``_``.

        Raises:
            ValueError: for a key that is no setting, listing the settings, or a bad value.
        """
        return cls(**cls.check_keys(values, source))


def _read_text(name: str, hint: Any, value: Any) -> Any:
    """A boolean or number given as text read as its flag reads it (see ``TrainConfig._read_text_values``)."""
    if hint is bool:
        return parse_bool(value, name)
    if isinstance(value, str) and hint in _NUMBER_TYPES:
        kind = _NUMBER_TYPES[hint]
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{name} must be a number ({kind.__name__}), got {value!r}") from None
    return value


def build_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
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


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML config file (keys as in the flags).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not valid YAML (naming the line and column) or does not hold a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:  # a bad indentation: one line naming the place, not the parser's traceback
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path}:{where} not valid YAML ({problem})") from err
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(values).__name__}")
    return values


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


#: Each `TrainConfig` field's check (`hf_posext.validation`); a test keeps it complete.
FIELD_CHECKS: dict[str, Check] = {
    "model": required("a Hub id or a local checkpoint folder (--model)"),
    "method": _method,
    "factor": optional(_factor),  # None: DEFAULT_FACTOR, or 1 for a method that takes no factor
    "output_dir": required("the folder the fine-tuned checkpoint is written to (--output-dir)"),
    "overwrite": anything,
    "dataset": required("an HF dataset name or local .txt/.jsonl files (--dataset)"),
    "dataset_split": anything,
    "text_field": anything,
    "packing": anything,
    "loss_on": choice(LOSS_ON),
    "chat_template": anything,
    "skip_bad_records": anything,
    "seq_len": optional(integer(2)),
    "max_train_steps": integer(1),
    "learning_rate": number(0, low_open=True),
    "lr_scheduler": choice(SCHEDULERS),
    "lr_scheduler_kwargs": mapping(),
    "warmup_steps": optional(integer(0)),
    "adam_beta1": number(0, 1, high_open=True),
    "adam_beta2": number(0, 1, high_open=True),
    "adam_epsilon": number(0, low_open=True),
    "weight_decay": number(0),
    "max_grad_norm": number(0),
    "global_batch_size": integer(1),
    "micro_batch_size": integer(1),
    "mixed_precision": choice(MIXED_PRECISIONS),
    "activation_checkpointing": anything,
    "activation_offload": anything,
    "loss_chunk_size": integer(0),
    "attn_implementation": anything,
    "lora": anything,
    "lora_rank": integer(1),
    "lora_alpha": integer(0),
    "lora_dropout": number(0, 1, high_open=True),
    "lora_target_modules": _target_modules,
    "pose": anything,
    "pose_window": optional(integer(2)),
    "pose_chunks": integer(1),
    "short_fraction": number(0, 1, high_open=True),
    "short_seq_len": optional(integer(2)),
    "short_dataset": anything,
    "window_schedule": choice(SCHEDULES),
    "window_start": optional(integer(2)),
    "window_ramp_steps": optional(integer(1)),
    "sp_size": integer(1),
    "checkpointing_steps": integer(0),
    "checkpoint_dir": anything,
    "checkpoints_total_limit": integer(0),
    "resume": anything,
    "cache_dir": anything,
    "eval_blocks": integer(0),
    "seed": integer(0),
    "save_dtype": choice(SAVE_DTYPES),
    "report_to": choice(REPORT_TO),
    "method_kwargs": mapping("a mapping of method arguments"),
}
