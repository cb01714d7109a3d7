"""``hf-posext doctor PATH``: how transformers 4 and 5, vLLM, SGLang and llama.cpp read a checkpoint's rope.

    hf-posext doctor path/to/checkpoint          # a folder holding config.json (any checkpoint, patched or not)
    hf-posext doctor Qwen/Qwen2.5-7B-Instruct     # a Hub id, through huggingface_hub's cache (HF_HUB_OFFLINE=1 works)
    hf-posext doctor model.Q4_K_M.gguf --json     # a GGUF file; --json: {"readers": {"transformers5": ...}, ...}

Per reader a verdict (same, misread, refused; unknown where no rule covers it), why, and the version rules it used
(`hf_posext.readers.doctor`); then the checks of the config itself. Exit 0 once it has answered.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .arguments import plain


def _config_file(path: str) -> Path:
    """config.json of a checkpoint folder, or of a Hub id through huggingface_hub (its cache and offline rules).

    Raises:
        FileNotFoundError: a folder without config.json, a file that is not a GGUF, a path-shaped name that
            does not exist, a Hub id that is neither cached nor reachable.
    """
    from ..validation import path_shape

    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"{path!r} is a folder without config.json: not a checkpoint (doctor reads a "
                "checkpoint folder, a Hub id or a .gguf file)"
            )
        return local / "config.json"
    if local.exists():
        raise FileNotFoundError(
            f"{path!r} is a file but not a .gguf file: doctor reads a checkpoint folder, a Hub id or a .gguf file"
        )
    reason = path_shape(path)
    if reason is not None:
        raise FileNotFoundError(
            f"{path!r} does not exist (a local path: {reason}); give a checkpoint folder, a .gguf "
            "file or a Hub id as org/name"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    from ..gguf import check_model_source

    check_model_source(path, "checkpoint")  # the Hub not answering: at once, not after the download's retries

    try:
        return Path(hf_hub_download(path, "config.json"))
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError) as error:
        offline = " (HF_HUB_OFFLINE is set and it is not in the cache)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise FileNotFoundError(
            f"{path!r} is no local path and its config.json could not be had from the Hub"
            f"{offline}: {str(error).splitlines()[0]}"
        ) from None


def read_config_json(file: Path) -> dict[str, Any]:
    """config.json as a dict.

    Raises:
        ValueError: naming the file: not UTF-8 (and where), not JSON, or JSON that is not an object.
    """
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{file} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): config.json must "
            "be UTF-8 JSON"
        ) from None
    try:
        config_json = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{file} is not valid JSON ({error})") from None
    if not isinstance(config_json, dict):
        raise ValueError(f"{file} holds {type(config_json).__name__}, not a JSON object")
    return config_json


#: Reads argv[1] with transformers 5 in a process that cannot import hf_posext and builds its model on the meta
#: device; prints the error's type and message, or nothing where it builds one.
_VANILLA_BUILD = """
import sys
sys.modules["hf_posext"] = None
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging
logging.set_verbosity_error()
try:
    config = AutoConfig.from_pretrained(sys.argv[1])
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(config)
except Exception as error:
    print(f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
"""


def _transformers5_builds(file: Path) -> dict[str, str | None]:
    """What transformers 5 raises reading ``file`` and building its model on the meta device (no memory), or
    ``None`` where it builds one: without hf_posext (a fresh interpreter that cannot import it) and with it (here).
    Run, not ruled, for configs whose values no rule can read."""
    import subprocess
    import sys

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    done = subprocess.run(
        [sys.executable, "-c", _VANILLA_BUILD, str(file.parent)], capture_output=True, text=True, timeout=300
    )
    vanilla = done.stdout.strip().replace(str(file.parent), "FOLDER") or None
    if done.returncode != 0:
        vanilla = f"the interpreter exited with {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    plugin = None
    with _transformers_warnings():
        try:
            config = AutoConfig.from_pretrained(file.parent)
            with torch.device("meta"):
                AutoModelForCausalLM.from_config(config)
        except Exception as error:  # noqa: BLE001 -- any error here is the reader's answer: refused, and which
            plugin = f"{type(error).__name__}: " + " ".join(str(error).split())[:300]
    return {"transformers5": vanilla, "transformers5_hf_posext": plugin}


def diagnose_path(path: str) -> dict[str, Any]:
    """`hf_posext.readers.doctor.diagnose` (or ``diagnose_gguf``) of a checkpoint folder, Hub id or .gguf file.

    Raises:
        FileNotFoundError: see `_config_file`.
        ValueError: a config.json that is not JSON or that transformers cannot read, a model with no rotary
            position embedding, a damaged GGUF file.
    """
    from ..gguf import is_gguf
    from ..readers import doctor

    if is_gguf(path):
        from ..gguf.writer import architecture, check_model_keys, open_gguf, read_rope

        reader = open_gguf(path)
        check_model_keys(reader, path)
        arch = architecture(reader)
        from ..readers import gguf_doctor
        from ..validation.config_damage import gguf_damage

        prefix = f"{arch}."
        every = {name[len(prefix) :]: f.contents() for name, f in reader.fields.items() if name.startswith(prefix)}
        damaged = gguf_damage(arch, every)
        if damaged:
            return {"path": str(path), **gguf_doctor.diagnose_damaged_gguf(arch, damaged)}
        try:
            rope = read_rope(reader)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        keys = {name: value for name, value in every.items() if name.startswith("rope.")}
        return {"path": str(path), **gguf_doctor.diagnose_gguf(arch, rope, keys)}
    file = _config_file(path)
    config_json = read_config_json(file)
    import transformers
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import CONFIG_MAPPING, AutoConfig

    from ..readers.config_checks import check_config
    from ..validation.config_damage import rope_damage
    from ..rope_utils import CONFIG_KEY

    model_type = config_json.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"{file}: model_type {model_type!r} is not one transformers {transformers.__version__} knows "
            "(a remote-code model?): doctor reads the configs transformers reads"
        )
    checks = check_config(config_json, None)
    damaged = rope_damage(checks)
    if damaged:
        return {"path": str(path), **doctor.diagnose_damaged(config_json, damaged, _transformers5_builds(file))}
    with _transformers_warnings() as warned:
        try:
            config = AutoConfig.from_pretrained(file.parent)
        except (ValueError, KeyError, TypeError, StrictDataclassClassValidationError) as error:
            text = " ".join(line.strip() for line in str(error).splitlines())
            report = doctor.diagnose_unreadable(config_json, f"{type(error).__name__}: {text}")
            return {"path": str(path), **report}
    if not isinstance(getattr(config, "rope_parameters", None), dict):
        raise ValueError(
            f"{path}: model_type {config.model_type!r} has no rotary position embedding (no rope_parameters):"
            " there is no rope for a reader to misread (doctor checks rotary decoders)"
        )
    if any(c.get("field", "").startswith(CONFIG_KEY) for c in checks):
        config.__dict__.pop(CONFIG_KEY, None)  # a damaged record (its error is in the checks): the rope alone is judged
    report = doctor.diagnose(config_json, config)
    report["checks"] += [
        {
            "check": "transformers-warns",
            "severity": "warning",
            "message": f"transformers {transformers.__version__}: {text}",
        }
        for text in dict.fromkeys(warned)
        if "rope" in text.lower()
    ]
    return {"path": str(path), **report}


@contextlib.contextmanager
def _transformers_warnings() -> Iterator[list[str]]:
    """The messages transformers logs inside the block, collected instead of printed."""
    from transformers.utils import logging as hf_logging

    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    hf_logging.disable_default_handler()
    hf_logging.add_handler(handler)
    try:
        yield messages
    finally:
        hf_logging.remove_handler(handler)
        hf_logging.enable_default_handler()


def render(report: dict[str, Any]) -> str:
    """The human-readable report: the rope, one line per reader (and route), then the config checks."""
    rope = report["rope"]
    lines = [f"{report['path']}: " + ", ".join(f"{k} {v}" for k, v in rope.items() if v is not None), "", "readers:"]
    width = max(len(name) for name in report["readers"])
    for name, finding in report["readers"].items():
        lines.append(f"  {name:<{width}}  {finding['verdict']:<12}  {finding['why']}")
        for route, sub in finding.get("routes", {}).items():
            lines.append(f"  {'':<{width}}    {route}: {sub['verdict']}: {sub['why']}")
        lines.append(f"  {'':<{width}}    rules: {finding['rules']} [{finding['checked']}]")
    lines += ["", "config:"]
    lines += [f"  {c['severity']}: {c['check']}: {c['message']}" for c in report["checks"]] or ["  no problem found"]
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    if args.live:  # the model loaded and its modules checked against its config (exit 1 on a mismatch)
        from .doctor_live import main as live

        return live(args)
    report = diagnose_path(args.path)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext doctor``."""
    p = subparsers.add_parser(
        "doctor",
        help="how transformers 4/5, vLLM, SGLang and llama.cpp read a checkpoint's rope, and what is wrong with it",
        description=plain(__doc__.split("\n\n")[0]),
    )
    p.add_argument("path", help="a checkpoint folder, a Hub id (org/name) or a .gguf file")
    p.add_argument("--json", action="store_true", help='print {"rope", "checks", "readers": {...}} as JSON')
    p.add_argument(
        "--live",
        action="store_true",
        help="load the model (CPU, fp32) and check that its rotary modules and attention run its config "
        "(hf_posext.verify): one line per mismatch and exit 1, else exit 0",
    )
    p.set_defaults(func=_main)
