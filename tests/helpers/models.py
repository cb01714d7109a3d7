"""Tiny real transformers models built from configs (scripts/tiny_models.py), token batches, one-thread runs."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel

# Re-exported: the tests import the tiny models from here; they live in scripts/ because benchmarks build them too.
from scripts.tiny_models import ARCHITECTURES, VOCAB, tiny_config, tiny_model  # noqa: F401


def tokens(length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=generator)


def train_steps(model: PreTrainedModel, ids: torch.Tensor, steps: int = 10, lr: float = 1e-2) -> list[float]:
    """AdamW on the language-model loss of ``ids`` for ``steps`` steps; the losses, first to last."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread: tiny models gain nothing from more, and on a small shared CPU OpenMP
    threads contending for busy cores make their matmuls tens of times slower. It also keeps
    runs that are compared bit for bit (resumes, subprocesses) on the same reduction order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# The rope settings of published checkpoints, copied from their config.json (rope_scaling merged
# into rope_parameters as transformers 5 does), for tiny models with the real rotary shapes.
# Only the rope settings, head_dim and context are real; the models stay tiny (2 heads, 2 layers).
_PHI3_MINI_128K_LONG = [
    1.0800000429153442,
    1.1100000143051147,
    1.1399999856948853,
    1.340000033378601,
    1.5899999141693115,
    1.600000023841858,
    1.6200000047683716,
    2.620000123977661,
    3.2300000190734863,
    3.2300000190734863,
    4.789999961853027,
    7.400000095367432,
    7.700000286102295,
    9.09000015258789,
    12.199999809265137,
    17.670000076293945,
    24.46000099182129,
    28.57000160217285,
    30.420001983642578,
    30.840002059936523,
    32.590003967285156,
    32.93000411987305,
    42.320003509521484,
    44.96000289916992,
    50.340003967285156,
    50.45000457763672,
    57.55000305175781,
    57.93000411987305,
    58.21000289916992,
    60.1400032043457,
    62.61000442504883,
    62.62000274658203,
    62.71000289916992,
    63.1400032043457,
    63.1400032043457,
    63.77000427246094,
    63.93000411987305,
    63.96000289916992,
    63.970001220703125,
    64.02999877929688,
    64.06999969482422,
    64.08000183105469,
    64.12000274658203,
    64.41000366210938,
    64.4800033569336,
    64.51000213623047,
    64.52999877929688,
    64.83999633789062,
]
_PHI3_MINI_128K_SHORT = [
    1.0,
    1.0199999809265137,
    1.0299999713897705,
    1.0299999713897705,
    1.0499999523162842,
    1.0499999523162842,
    1.0499999523162842,
    1.0499999523162842,
    1.0499999523162842,
    1.0699999332427979,
    1.0999999046325684,
    1.1099998950958252,
    1.1599998474121094,
    1.1599998474121094,
    1.1699998378753662,
    1.2899998426437378,
    1.339999794960022,
    1.679999828338623,
    1.7899998426437378,
    1.8199998140335083,
    1.8499997854232788,
    1.8799997568130493,
    1.9099997282028198,
    1.9399996995925903,
    1.9899996519088745,
    2.0199997425079346,
    2.0199997425079346,
    2.0199997425079346,
    2.0199997425079346,
    2.0199997425079346,
    2.0199997425079346,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0299997329711914,
    2.0799996852874756,
    2.0899996757507324,
    2.189999580383301,
    2.2199995517730713,
    2.5899994373321533,
    2.729999542236328,
    2.749999523162842,
    2.8399994373321533,
]

#: name -> (architecture, config keyword arguments); see :func:`published_model`.
PUBLISHED = {
    # meta-llama/Llama-3.1-8B: llama3 scaling, advertised 131072
    "llama-3.1": (
        "llama",
        dict(
            head_dim=128,
            max_positions=131072,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
    # Qwen/Qwen2.5-7B-Instruct with the yarn entry its model card gives for texts past 32768
    "qwen2.5": (
        "qwen2",
        dict(
            head_dim=128,
            max_positions=32768,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        ),
    ),
    # mistralai/Mistral-7B-v0.1: theta 1e4, 4096-token sliding window
    "mistral-7b-v0.1": (
        "mistral",
        dict(
            head_dim=128,
            max_positions=32768,
            sliding_window=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # mistralai/Mistral-7B-v0.3: theta 1e6, no sliding window
    "mistral-7b-v0.3": (
        "mistral",
        dict(
            head_dim=128,
            max_positions=32768,
            sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    # microsoft/Phi-3-mini-128k-instruct's longrope (head_dim 96) on a Llama body: the rope maths
    # are the same; the Phi-3 architecture itself is tested with the other architectures
    "phi-3-mini-128k": (
        "llama",
        dict(
            head_dim=96,
            max_positions=131072,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 4096,
                "long_factor": _PHI3_MINI_128K_LONG,
                "short_factor": _PHI3_MINI_128K_SHORT,
            },
        ),
    ),
}

#: google/gemma-3-4b-pt's rope: global layers linear 8 over theta 1e6, sliding (1024) layers theta 1e4.
GEMMA3_ROPE_PARAMETERS = {
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}
GEMMA3_CONTEXT = dict(max_position_embeddings=131072, sliding_window=1024)


def published_model(name: str, seed: int = 0) -> PreTrainedModel:
    """A tiny model (2 heads of the real head_dim, 2 layers) with the rope settings of ``PUBLISHED[name]``."""
    arch, kwargs = PUBLISHED[name]
    return tiny_model(arch, seed=seed, heads=2, kv_heads=1, **copy.deepcopy(kwargs))
