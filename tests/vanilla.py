"""Load a checkpoint in a fresh interpreter that never imports hf_posext (what a user without the
plugin, or another runtime reading config.json, gets)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
