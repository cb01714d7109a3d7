"""Load a checkpoint in a fresh interpreter that never imports hf_posext (what a user without the
plugin, or another runtime reading config.json, gets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

# Loads every (checkpoint, from_pretrained keyword arguments) of argv[1] in turn: a line per attempt, the JSON
# null if it loaded, else the error's type and message. One interpreter for all of them (each start costs ~3 s).
_REFUSAL = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_posext"] = None  # any `import hf_posext` now raises ImportError
    from transformers import AutoModelForCausalLM
    for checkpoint, kwargs in json.loads(sys.argv[1]):
        try:
            AutoModelForCausalLM.from_pretrained(checkpoint, **kwargs)
            print("attempt:", json.dumps(None), flush=True)
        except Exception as error:
            print("attempt:", json.dumps(f"{type(error).__name__} {error}"), flush=True)
    """
)


def vanilla_load_errors(attempts) -> list[str | None]:
    """The error vanilla transformers raises for each ``(checkpoint, from_pretrained keyword arguments)``, or
    ``None`` where it loads; every attempt in one fresh interpreter."""
    attempts = [(str(checkpoint), dict(kwargs)) for checkpoint, kwargs in attempts]
    result = subprocess.run(
        [sys.executable, "-c", _REFUSAL, json.dumps(attempts)],
        capture_output=True,
        text=True,
        timeout=120 + 15 * len(attempts),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    errors = [
        json.loads(line[len("attempt: ") :]) for line in result.stdout.splitlines() if line.startswith("attempt: ")
    ]
    assert len(errors) == len(attempts), result.stdout
    return errors


def vanilla_load_error(checkpoint) -> str:
    """The error vanilla transformers raises loading ``checkpoint``; fails the test if it loads."""
    (error,) = vanilla_load_errors([(checkpoint, {})])
    assert error is not None, f"vanilla transformers loaded {checkpoint}"
    return error


_LOGITS = textwrap.dedent(
    """
    import sys
    sys.modules["hf_posext"] = None  # any `import hf_posext` now raises ImportError
    import torch
    from transformers import AutoModelForCausalLM
    inputs = torch.load(sys.argv[1])
    for checkpoint in sys.argv[2:]:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
        with torch.no_grad():
            torch.save([model(**kwargs).logits for kwargs in inputs], checkpoint + "/vanilla-logits.pt")
    """
)


def vanilla_logits(checkpoints, inputs: list[dict], scratch) -> dict:
    """``{checkpoint: [logits of model(**kwargs) for kwargs in inputs]}`` from one fresh interpreter
    that loads each checkpoint without hf_posext (what a user without the plugin, or vLLM's loader
    reading config.json, gets).

    The interpreter uses as many threads as this one, so that matmul reductions (MoE experts among
    them) run in the same order and logits compare bit for bit.
    """
    torch.save(inputs, f"{scratch}/vanilla-inputs.pt")
    result = subprocess.run(
        [sys.executable, "-c", _LOGITS, f"{scratch}/vanilla-inputs.pt", *map(str, checkpoints)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {checkpoint: torch.load(f"{checkpoint}/vanilla-logits.pt") for checkpoint in checkpoints}
