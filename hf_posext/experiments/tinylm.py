"""Pretrain a tiny byte-level Llama from scratch on the Python standard library, cached.

The model every offline experiment extends (~0.85M parameters, UTF-8 bytes, ~3 min on 2 cores,
resumable, cached by config hash); why not the recipe's loop: docs/results/reproduction.md.

    model, tokenizer, info = pretrain(TinyLMConfig())
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    get_scheduler,
)

from ..data import default_cache_dir, stdlib_files
from ..eval.passkey import KEY_RANGE, build_prompt, fit_filler
from ..testing import BOS_ID, BYTE_VOCAB_SIZE, EOS_ID, PAD_ID, byte_tokenizer
from ..files import atomic_directory
from ..methods import available_methods
from ..patching import patch_model
from ..train.saved_state import latest_checkpoint, load_checkpoint, save_checkpoint


@dataclass(frozen=True)
class TinyLMConfig:
    """A from-scratch pretraining run; every field enters the cache key.

    Args:
        seq_len: the training context L_train (every sequence has exactly this many tokens).
        steps: optimizer steps.
        batch_size: sequences per step.
        hidden_size: model width; ``head_dim = hidden_size // num_heads``.
        num_layers: decoder layers.
        num_heads: attention heads (no grouped-query attention: the model is tiny anyway).
        rope_theta: RoPE base.
        lr: peak AdamW learning rate, reached after ``warmup_steps`` and decayed to 10% (cosine).
        warmup_steps: linear warm-up steps.
        weight_decay: AdamW weight decay.
        position: ``"rope"`` or the name of a registered non-RoPE method (``"alibi"``,
            ``"sinusoidal"``, ``"learned"``) applied with ``patch_model`` before training.
        passkey_fraction: share of training sequences that are passkey prompts ending with the
            answer (the retrieval task of the reproduction); 0 for plain language modelling.
        max_train_bytes: use only the first this-many bytes of the training files (``None``: all).
        seed: seeds the weights and the batch sampling.
    """

    seq_len: int = 128
    steps: int = 600
    batch_size: int = 32
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    rope_theta: float = 10_000.0
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    position: str = "rope"
    passkey_fraction: float = 0.0
    max_train_bytes: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("seq_len", "steps", "batch_size", "hidden_size", "num_layers", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyLMConfig.{name} must be a positive int, got {value!r}")
        if self.seq_len < 8:
            raise ValueError(f"TinyLMConfig.seq_len must be at least 8, got {self.seq_len!r}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"TinyLMConfig.num_heads={self.num_heads} must divide hidden_size={self.hidden_size} "
                "into an even head size"
            )
        if not 0.0 <= self.passkey_fraction <= 1.0:
            raise ValueError(f"TinyLMConfig.passkey_fraction must be in [0, 1], got {self.passkey_fraction!r}")
        if not (self.lr > 0 and self.warmup_steps >= 0 and self.weight_decay >= 0):
            raise ValueError(
                f"TinyLMConfig needs lr > 0, warmup_steps >= 0, weight_decay >= 0; got lr={self.lr!r}, "
                f"warmup_steps={self.warmup_steps!r}, weight_decay={self.weight_decay!r}"
            )
        if self.position != "rope" and self.position not in available_methods():
            raise ValueError(
                f"TinyLMConfig.position must be 'rope' or a registered method, got {self.position!r}; "
                f"registered: {', '.join(available_methods())}"
            )

    def key(self) -> str:
        """A short hash of the run (config, Python version for the data, transformers major version)."""
        payload = {
            **dataclasses.asdict(self),
            "python": platform.python_version(),
            "transformers": transformers.__version__.split(".")[0],
            # 3: transformers' warm-up (lr 0 at step 0). 2: passkey sequences scored on their answer only.
            "format": 3,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def model_config(config: TinyLMConfig) -> LlamaConfig:
    """The Llama config of a tiny run: byte vocabulary, ``max_position_embeddings = seq_len``."""
    return LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=config.hidden_size,
        intermediate_size=4 * config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def stdlib_corpus(split: str = "train", max_bytes: int | None = None) -> torch.Tensor:
    """The stdlib split as one ``[n_tokens]`` int64 stream: BOS then the file's bytes, per file."""
    chunks, total = [], 0
    for path in stdlib_files(split):  # type: ignore[arg-type]
        data = path.read_bytes()
        if max_bytes is not None:
            data = data[: max_bytes - total]
        chunk = torch.empty(len(data) + 1, dtype=torch.long)
        chunk[0] = BOS_ID
        chunk[1:] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0)
        chunks.append(chunk)
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    return torch.cat(chunks)


def _passkey_sequence(
    rng: random.Random, seq_len: int, tokenizer: PreTrainedTokenizerFast, fillers: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A passkey prompt without the task line (it alone is ~150 bytes) and its answer, PAD-filled.

    The filler length and key depth are drawn at random, so the model practises retrieval at
    every distance up to ``seq_len``. Only the answer is scored (labels are -100 elsewhere): the
    key's own digits are random, and their irreducible loss would drown the copying signal.

    Returns:
        ``(input_ids [seq_len], labels [seq_len])``.
    """
    key = rng.randint(*KEY_RANGE)
    prompt = tokenizer.encode(build_prompt(key, rng.randint(0, fillers), rng.random(), task=""))
    answer = tokenizer.encode(f" {key}.", add_special_tokens=False)
    ids = (prompt + answer)[:seq_len]
    labels = ([-100] * len(prompt) + answer)[:seq_len]
    pad = seq_len - len(ids)
    return (torch.tensor(ids + [PAD_ID] * pad, dtype=torch.long), torch.tensor(labels + [-100] * pad, dtype=torch.long))


@dataclass
class _Progress:
    """Steps done, training seconds and losses so far, saved with the training state."""

    step: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.seconds, self.losses = int(state["step"]), float(state["seconds"]), list(state["losses"])


#: Longest input a from-scratch ``learned`` model accepts, in multiples of its training length:
#: its table rows beyond ``seq_len`` are never trained, which is the baseline's point.
LEARNED_TABLE_MULTIPLE = 16


def build_model(config: TinyLMConfig) -> PreTrainedModel:
    """A freshly initialised tiny model (seeded), with its position method applied."""
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config(config))
    if config.position != "rope":
        extra = {"max_length": LEARNED_TABLE_MULTIPLE * config.seq_len} if config.position == "learned" else {}
        patch_model(model, config.position, **extra)
    return model


def _load(path: Path, config: TinyLMConfig) -> PreTrainedModel:
    # A non-RoPE model needs no re-patch: `import hf_posext` rebuilds ALiBi attention and
    # absolute tables from config.json as the checkpoint loads (and re-patching would
    # re-initialise a learned table).
    model = AutoModelForCausalLM.from_pretrained(path)
    method = getattr(model.config, "hf_posext", {}).get("method") if config.position != "rope" else None
    if config.position != "rope" and method != config.position:
        raise RuntimeError(f"{path} reloaded with position method {method!r}, expected {config.position!r}")
    return model.eval()


def _cache_path(config: TinyLMConfig, root: Path) -> Path:
    return root / f"tinylm-{config.key()}"


def is_cached(config: TinyLMConfig, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether `pretrain` would load ``config``'s model from the cache rather than train it."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return (_cache_path(config, root) / "train_info.json").exists()


def _prepare_training(
    config: TinyLMConfig, states: Path, retrain: bool
) -> tuple[Accelerator, Any, Any, Any, _Progress]:
    """``(accelerator, model, optimizer, scheduler, progress)`` prepared, resumed from ``states`` if it holds one.

    ``retrain`` deletes ``states`` first. The model is built (seeded) before anything else draws.
    """
    model = build_model(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    # Cosine from lr to 10% of it after a linear warm-up.
    scheduler = get_scheduler(
        "cosine_with_min_lr",
        optimizer,
        num_warmup_steps=config.warmup_steps,
        num_training_steps=config.steps,
        scheduler_specific_kwargs={"min_lr_rate": 0.1},
    )
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    progress_state = _Progress()
    accelerator.register_for_checkpointing(scheduler, progress_state)
    if retrain:
        shutil.rmtree(states, ignore_errors=True)
    resume_from = latest_checkpoint(states)
    if resume_from is not None:
        load_checkpoint(accelerator, resume_from)
    return accelerator, model, optimizer, scheduler, progress_state


def _training_batch(
    config: TinyLMConfig, corpus: torch.Tensor, step: int, tokenizer: PreTrainedTokenizerFast, fillers: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)`` of ``step``: corpus windows, ``passkey_fraction`` of the rows passkey sequences.

    Batches depend on (seed, step) only, so a resumed run sees the same data as an uninterrupted one.
    """
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    rng = random.Random(config.seed * 1_000_003 + step)
    offsets = torch.randint(0, corpus.numel() - config.seq_len, (config.batch_size,), generator=gen)
    batch = torch.stack([corpus[o : o + config.seq_len] for o in offsets.tolist()])
    labels = batch.clone()
    n_passkey = sum(rng.random() < config.passkey_fraction for _ in range(config.batch_size))
    for row in range(n_passkey):
        batch[row], labels[row] = _passkey_sequence(rng, config.seq_len, tokenizer, fillers)
    return batch, labels


def _train_info(config: TinyLMConfig, model: Any, losses: list[float], seconds: float) -> dict[str, Any]:
    """What train_info.json records: the config, the size, the final loss (last 20 steps), time and versions."""
    return {
        "config": dataclasses.asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def pretrain(
    config: TinyLMConfig = TinyLMConfig(),
    cache_dir: str | os.PathLike | None = None,
    *,
    progress: bool = True,
    retrain: bool = False,
    checkpoint_every: int = 100,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict[str, Any]]:
    """Train (or load from the cache) a tiny byte-level model on the stdlib's training files.

    Args:
        config: the run.
        cache_dir: the cache root (default `hf_posext.data.default_cache_dir`); the model lives in
            ``cache_dir/tinylm-<config.key()>/``.
        progress: show a tqdm bar with the loss.
        retrain: ignore a cached model and train again.
        checkpoint_every: save a resumable training state every this many steps.

    Returns:
        ``(model in eval mode, byte tokenizer, info)`` where info holds the config, the final
        training loss, the wall time of training, threads and versions.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = _cache_path(config, root)
    tokenizer = byte_tokenizer()
    if (path / "train_info.json").exists() and not retrain:
        return _load(path, config), tokenizer, json.loads((path / "train_info.json").read_text())

    states = root / f".tinylm-{config.key()}.resume"
    accelerator, model, optimizer, scheduler, progress_state = _prepare_training(config, states, retrain)
    corpus = stdlib_corpus("train", config.max_train_bytes)
    if corpus.numel() <= config.seq_len:
        raise ValueError(f"the training corpus has {corpus.numel()} tokens, fewer than seq_len={config.seq_len}")
    fillers = fit_filler(tokenizer, config.seq_len - 8, task="") if config.passkey_fraction > 0 else 0
    t0, start, losses = time.perf_counter(), progress_state.step, progress_state.losses
    bar = tqdm(
        range(start, config.steps),
        desc=f"pretrain tiny {config.position} L={config.seq_len}",
        disable=not progress,
        initial=start,
        total=config.steps,
    )
    for step in bar:
        batch, labels = _training_batch(config, corpus, step, tokenizer, fillers)
        loss = model(input_ids=batch.to(accelerator.device), labels=labels.to(accelerator.device)).loss
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        progress_state.step = step + 1
        if (step + 1) % checkpoint_every == 0 and step + 1 < config.steps:
            progress_state.seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            save_checkpoint(accelerator, states, step + 1, keep=1)
    bar.close()
    info = _train_info(config, model, losses, progress_state.seconds + time.perf_counter() - t0)
    model = accelerator.unwrap_model(model).eval()
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "train_info.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(states, ignore_errors=True)
    return _load(path, config), tokenizer, info
