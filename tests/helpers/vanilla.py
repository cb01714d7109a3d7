"""Load a checkpoint in a fresh interpreter that never imports hf_posext (what a user without the
plugin, or another runtime reading config.json, gets)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

_REFUSAL = textwrap.dedent(
    """
    import sys
    sys.modules["hf_posext"] = None  # any `import hf_posext` now raises ImportError
    from transformers import AutoModelForCausalLM
    try:
        AutoModelForCausalLM.from_pretrained(sys.argv[1])
    except Exception as error:
        print(type(error).__name__, error)
        sys.exit(0)
    sys.exit(2)
    """
)


def vanilla_load_error(checkpoint) -> str:
    """The error vanilla transformers raises loading ``checkpoint``; fails the test if it loads."""
    result = subprocess.run(
        [sys.executable, "-c", _REFUSAL, str(checkpoint)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"vanilla transformers loaded {checkpoint}:\n{result.stdout}{result.stderr}"
    return result.stdout


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
