"""A cached virtual environment with transformers 4.57.x, to run real 4.x loads in a subprocess.

The venv holds only transformers 4.57.x, huggingface_hub < 1 and tokenizers 0.22 (what 4.57
pins); a ``.pth`` file appends this interpreter's site-packages, so it uses the same CPU torch
2.13.0, numpy and safetensors wheels instead of unpacking another 1 GB torch (about 2 minutes
here). Its own site-packages come first on ``sys.path``, so ``import transformers`` is 4.57.

Built once under ``.cache/`` (a file lock makes concurrent test processes wait for one build)
and rebuilt when this interpreter's site-packages or torch version changes.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import torch

from . import ROOT

VENV = ROOT / ".cache" / "transformers-4.57"
REQUIREMENTS = ("transformers==4.57.*", "huggingface_hub>=0.34,<1.0", "tokenizers>=0.22,<=0.23.0")


def _stamp() -> dict[str, str]:
    paths = sysconfig.get_paths()
    return {
        "parent": paths["purelib"],
        "platlib": paths["platlib"],
        "torch": torch.__version__,
        "requirements": " ".join(REQUIREMENTS),
    }


def _python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def _build(venv_dir: Path) -> None:
    venv.EnvBuilder(clear=True, with_pip=False).create(venv_dir)
    site = Path(
        subprocess.check_output(
            [str(_python(venv_dir)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    stamp = _stamp()
    (site / "parent-site-packages.pth").write_text("\n".join(dict.fromkeys([stamp["parent"], stamp["platlib"]])) + "\n")
    # --no-deps: everything else transformers 4.57 imports is already in the parent environment
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(_python(venv_dir)),
            "install",
            "--quiet",
            "--no-deps",
            *REQUIREMENTS,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    version = subprocess.check_output(
        [str(_python(venv_dir)), "-c", "import transformers; print(transformers.__version__)"], text=True
    ).strip()
    if not version.startswith("4.57."):
        raise RuntimeError(f"the transformers 4.57 venv at {venv_dir} imports transformers {version}")


def transformers4_python() -> Path:
    """The python of the cached transformers 4.57 venv, built on first use."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "transformers-4.57.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = VENV / "ready.json"
        if not (ready.is_file() and json.loads(ready.read_text()) == _stamp() and _python(VENV).exists()):
            _build(VENV)
            ready.write_text(json.dumps(_stamp()))
    return _python(VENV)
