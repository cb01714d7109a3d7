"""The plain transformers ``Trainer`` the training benchmarks compare the recipe against.

Shared by ``bench_train.py`` and ``bench_long_train.py``: the same model loading, yarn patch,
token blocks and ``TrainingArguments`` (the recipe's optimiser settings: AdamW (0.9, 0.95), no
weight decay, clip 1.0, linear schedule, activation checkpointing, CPU). Imports happen inside the
function, as in the benchmarks' runs: each measured run counts only its own approach's imports.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def trainer_baseline(
    workdir: Path,
    data: str,
    seq_len: int,
    factor: float,
    *,
    max_steps: int,
    warmup_steps: int,
    micro_batch: int,
    accumulation: int,
    logging_steps: int,
    on_step_end: Callable[[], None],
) -> tuple[Any, Any]:
    """``(trainer, tokenizer)`` for the checkpoint in ``workdir / "model"`` patched with yarn at ``factor``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    import hf_posext
    from hf_posext.train.blocks import load_blocks

    class Stamp(TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            on_step_end()

    class Blocks(torch.utils.data.Dataset):
        def __init__(self, blocks):
            self.blocks = blocks

        def __len__(self):
            return len(self.blocks)

        def __getitem__(self, i):
            ids = torch.from_numpy(self.blocks[i].astype("int64"))
            return {"input_ids": ids, "labels": ids}

    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    model = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32, attn_implementation="sdpa")
    hf_posext.patch_model(model, "yarn", factor=factor)
    blocks = load_blocks([data], tokenizer, seq_len, cache_dir=workdir / "cache")
    training_args = TrainingArguments(
        output_dir=str(workdir / "out-trainer"),
        max_steps=max_steps,
        learning_rate=2e-5,
        warmup_steps=warmup_steps,
        lr_scheduler_type="linear",
        adam_beta1=0.9,
        adam_beta2=0.95,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        gradient_checkpointing=True,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=logging_steps,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=42,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=Blocks(blocks), callbacks=[Stamp()])
    return trainer, tokenizer
