"""The tiny fine-tune every recipe test starts from: a 32-token Llama, real text, and one TrainConfig.

:func:`write_finetune_assets` writes the model (``llama/``) and ``data.txt`` (stdlib modules: real
text, no download); :func:`train_config` is the recipe's config for them, a two-step YaRN run whose
settings a test overrides by keyword. The ``finetune_assets`` fixture (tests/conftest.py) writes the
default assets once per test module.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hf_posext.testing import byte_tokenizer, make_tiny_model
from hf_posext.train import steps
from hf_posext.train.config import TrainConfig

#: The tiny model's context (its max_position_embeddings).
CONTEXT = 32


def write_finetune_assets(
    root: Path, *, context: int = CONTEXT, tokenizer_limit: bool = False, sources: Sequence[str] = ("textwrap.py",)
) -> Path:
    """A tiny Llama in ``root/llama`` and ``root/data.txt`` (the stdlib ``sources``, concatenated); returns ``root``.

    Args:
        context: the model's max_position_embeddings.
        tokenizer_limit: save the byte tokenizer with ``model_max_length=context``, as released tokenizers
            are limited to their model's context (SmolLM2: 8192).
    """
    make_tiny_model(root / "llama", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=context)
    if tokenizer_limit:
        byte_tokenizer(model_max_length=context).save_pretrained(root / "llama")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (root / "data.txt").write_text("".join((stdlib / source).read_text() for source in sources))
    return root


def train_config(assets: Path, output_dir: Path, **overrides: Any) -> TrainConfig:
    """The recipe's config for :func:`write_finetune_assets`' files: YaRN x2, 2 steps of 2 sequences, fp32."""
    values: dict[str, Any] = dict(
        model=str(assets / "llama"),
        method="yarn",
        factor=2,
        dataset=[str(assets / "data.txt")],
        output_dir=str(output_dir),
        max_train_steps=2,
        learning_rate=3e-3,
        warmup_steps=1,
        global_batch_size=2,
        micro_batch_size=2,
        mixed_precision="no",
        cache_dir=str(assets / "cache"),
        seed=7,
    )
    values.update(overrides)
    return TrainConfig(**values)


def record_forward_loss(
    monkeypatch: Any, entry: Callable[..., Any], before: Callable[[], Any] | None = None
) -> list[Any]:
    """Route the training loop's ``forward_loss`` through a recorder; returns the list it fills.

    Each micro-batch calls ``before()`` (if given), runs the real ``forward_loss`` and then appends
    ``entry(model, input_ids, position_ids, pose, kwargs, loss)`` (``kwargs`` holds ``shift_labels`` where the
    micro-batch brings its own labels).
    """
    seen: list[Any] = []
    real = steps.forward_loss

    def recording(model: Any, input_ids: Any, position_ids: Any, pose: bool = False, **kwargs: Any) -> Any:
        if before is not None:
            before()
        loss = real(model, input_ids, position_ids, pose=pose, **kwargs)
        seen.append(entry(model, input_ids, position_ids, pose, kwargs, loss))
        return loss

    monkeypatch.setattr("hf_posext.train.loop.forward_loss", recording)
    return seen
