"""``hf-posext doctor --live PATH``: the model loaded and its modules checked against its config (hf_posext.verify).

    hf-posext doctor --live path/to/checkpoint     # a folder, a Hub id or a .gguf file, loaded on CPU
    hf-posext doctor --live model.gguf --json      # {"path", "rotary_modules", "mismatches": [{...}]}

One line per mismatch and exit 1; a line saying how many rotary modules agree and exit 0; a path
that cannot be loaded, one line and exit 2. The same check in a script: ``hf_posext.verify(model)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any


def live_report(path: str) -> dict[str, Any]:
    """Load ``path`` as hf-posext loads it ([`from_pretrained`][hf_posext.from_pretrained], fp32 on CPU) and verify it.

    Raises:
        FileNotFoundError: a path-shaped source that does not exist.
        ValueError: a checkpoint or GGUF file that cannot be loaded (naming the file and the field),
            a model with no rotary embedding module.
    """
    import torch

    from .. import integration
    from ..gguf import check_model_source
    from ..loading import from_pretrained
    from ..verification import verify

    check_model_source(path)
    try:
        model = from_pretrained(path, dtype=torch.float32, device_map="cpu")
    except OSError as error:  # transformers: no config.json / weights, not a Hub id it can reach
        raise ValueError(f"{path}: cannot be loaded as a model ({str(error).splitlines()[0]})") from None
    rotary = [name for name, _ in integration.rotary_modules(model)]
    if not rotary:
        raise ValueError(f"{path}: the model has no rotary embedding module: there is no rope for verify to check")
    mismatches = verify(model)
    return {"path": str(path), "rotary_modules": rotary, "mismatches": [dataclasses.asdict(m) for m in mismatches]}


def main(args: argparse.Namespace) -> int:
    """Print the live report (``--json``: as JSON); 1 when the model does not run its config, else 0."""
    from ..verification import Mismatch

    report = live_report(args.path)
    if args.json:
        print(json.dumps(report, indent=2))
    elif report["mismatches"]:
        print("\n".join(f"{args.path}: {Mismatch(**m)}" for m in report["mismatches"]))
    else:
        modules = ", ".join(report["rotary_modules"])
        print(f"{args.path}: the loaded model runs its config ({len(report['rotary_modules'])} rotary: {modules})")
    return 1 if report["mismatches"] else 0


__all__ = ["live_report", "main"]
