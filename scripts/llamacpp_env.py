"""llama.cpp itself, built once from llama-cpp-python's source package, to run GGUF files in a subprocess.

The venv holds llama-cpp-python 0.3.36 compiled from its sdist into a wheel kept in the cache
(``-DGGML_NATIVE=OFF``, no llava, no ``common`` library: 236 CPU-seconds of compiling, measured
2026-12-02 on 2 shared cores, against 690 with ``common``; the wheel loads a GGUF and evaluates, checked)
and sentencepiece (which llama.cpp's converter imports); a ``.pth`` file appends this interpreter's
site-packages, so the same python also runs ``convert_hf_to_gguf.py`` with this torch and transformers.
The sdist is unpacked whole next to it: the converter, ``conversion/`` and ``gguf-py/`` are what
:func:`hf_posext.gguf.converter.find_converter` finds there.

Built once under ``$HF_POSEXT_CACHE`` or ``.cache/`` (file locks make concurrent test processes
wait for one build; ``.ci/run`` starts it in the background) and the venv rebuilt from the kept wheel
when this interpreter's site-packages or torch version changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import venv
from collections.abc import Iterator
from pathlib import Path

from . import ROOT

VERSION = "0.3.36"
CACHE = Path(os.environ.get("HF_POSEXT_CACHE") or ROOT / ".cache") / f"llama-cpp-python-{VERSION}"
SDIST = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
SOURCE = CACHE / f"llama_cpp_python-{VERSION}"
VENV = CACHE / "venv"
CONVERTER = SOURCE / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"

# Reads token ids and a JSON list of [GGUF, output] pairs, writes llama.cpp's logits for every position under each
# GGUF ([tokens, vocab] .npy), one model at a time in one process (a process per file costs ~0.5 s of start-up).
# Micro-batches of at most 2048 tokens: one of 16k would need a 16k x 16k x heads attention buffer.
RUN = """
import json, sys
import numpy as np
import llama_cpp
ids_file, jobs, threads = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
ids = json.loads(open(ids_file).read())
n = len(ids)
for path, out in jobs:
    model = llama_cpp.Llama(model_path=path, n_ctx=n, n_batch=n, n_ubatch=min(n, 2048), logits_all=True,
                            verbose=False, n_threads=threads)
    model.eval(ids)
    np.save(out, np.asarray(model.scores[:n], dtype=np.float32))
    model.close()
"""


def _stamp() -> dict[str, str]:
    import torch  # here: compile_wheel runs before torch is installed (.ci/run)

    paths = sysconfig.get_paths()
    return {"parent": paths["purelib"], "platlib": paths["platlib"], "torch": torch.__version__, "version": VERSION}


def _python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def _unpack() -> None:
    """The sdist, downloaded with pip and unpacked whole (the converter needs all of vendor/llama.cpp's Python)."""
    if not SDIST.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",  # the source package; its build requirements may be wheels
                f"llama-cpp-python=={VERSION}",
                "-d",
                str(CACHE),
            ],
            check=True,
            capture_output=True,
        )
    if not (SOURCE / "pyproject.toml").is_file() or not CONVERTER.is_file():
        with tarfile.open(SDIST) as archive:
            archive.extractall(CACHE, filter="data")


#: llama-cpp-python forces llama.cpp's common library on (chat parsers, an HTTP client: ~45% of the compile);
#: nothing the wheel installs links it, so the build here turns it off (read from the 0.3.36 sdist's CMakeLists.txt).
FORCED_COMMON = 'set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
COMMON_OFF = FORCED_COMMON.replace(" ON ", " OFF ")


def _wheel() -> Path:
    """llama-cpp-python's wheel compiled from the unpacked sdist, once (kept in the cache for venv rebuilds).

    ``-DGGML_NATIVE=OFF`` (a portable build), no llava/mtmd library (llama_cpp loads it only for multimodal
    chat handlers: llama_chat_format imports mtmd_cpp inside them), and no ``common`` (:data:`FORCED_COMMON`).
    """
    built = sorted((CACHE / "wheel").glob(f"llama_cpp_python-{VERSION}-*.whl"))
    if built:
        return built[-1]
    cmake = SOURCE / "CMakeLists.txt"
    text = cmake.read_text()
    if FORCED_COMMON in text:
        cmake.write_text(text.replace(FORCED_COMMON, COMMON_OFF))
    elif COMMON_OFF not in text:
        raise RuntimeError(f"{cmake} no longer forces LLAMA_BUILD_COMMON as {VERSION} did: check the build flags")
    flags = "-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(SOURCE), "-w", str(CACHE / "wheel.tmp")],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "CMAKE_ARGS": flags},
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling llama-cpp-python {VERSION} from {SOURCE} failed:\n{done.stderr[-3000:]}")
    os.replace(CACHE / "wheel.tmp", CACHE / "wheel")
    return next((CACHE / "wheel").glob(f"llama_cpp_python-{VERSION}-*.whl"))


def _build(venv_dir: Path) -> None:
    venv.EnvBuilder(clear=True, with_pip=False).create(venv_dir)
    site = Path(
        subprocess.check_output(
            [str(_python(venv_dir)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    stamp = _stamp()
    (site / "parent-site-packages.pth").write_text("\n".join(dict.fromkeys([stamp["parent"], stamp["platlib"]])) + "\n")
    wheel = _wheel()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(_python(venv_dir)),
            "install",
            "--quiet",
            str(wheel),
            "sentencepiece",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"installing {wheel.name} into {venv_dir} failed:\n{done.stderr[-3000:]}")
    version = subprocess.check_output(
        [str(_python(venv_dir)), "-c", "import llama_cpp; print(llama_cpp.__version__)"], text=True
    ).strip()
    if version != VERSION:
        raise RuntimeError(f"the llama.cpp venv at {venv_dir} imports llama-cpp-python {version}, not {VERSION}")


@contextlib.contextmanager
def _unpacked() -> Iterator[None]:
    """Holds the cache's file lock (one build for concurrent test processes) with the sdist unpacked."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _unpack()
        yield


def compile_wheel() -> Path:
    """Download, unpack and compile llama-cpp-python into the cache's wheel, without torch or a venv.

    ``.ci/run`` starts this first, in the background, so that compiling overlaps the installs.
    """
    with _unpacked():
        return _wheel()


def llamacpp_source() -> Path:
    """The unpacked ``vendor/llama.cpp`` of llama-cpp-python's sdist (converter, ``conversion/``, ``gguf-py/``)."""
    with _unpacked():
        return CONVERTER.parent


def llamacpp_python() -> Path:
    """The python of the cached llama.cpp venv (llama_cpp importable, the converter runnable), built on first use."""
    with _unpacked():
        ready = VENV / "ready.json"
        if not (ready.is_file() and json.loads(ready.read_text()) == _stamp() and _python(VENV).exists()):
            _build(VENV)
            ready.write_text(json.dumps(_stamp()))
    return _python(VENV)


def run_llamacpp(script: str, gguf_file: Path, ids: list[int], *args: str, timeout: float | None = 1800) -> str:
    """Run ``script`` in llama.cpp's interpreter as ``script GGUF IDS_FILE *args``; its standard output.

    ``ids`` go to a JSON file next to ``gguf_file`` (one per length, so runs at other lengths can share it).

    Raises:
        RuntimeError: the script failed (the end of its standard error is in the message).
    """
    ids_file = gguf_file.with_suffix(f".ids-{len(ids)}.json")
    ids_file.write_text(json.dumps([int(i) for i in ids]))
    done = subprocess.run(
        [str(llamacpp_python()), "-c", script, str(gguf_file), str(ids_file), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp failed on {gguf_file}:\n{done.stderr[-3000:]}")
    return done.stdout


def llamacpp_logits(gguf_file: Path, ids: list[int], threads: int = 1) -> object:
    """llama.cpp's logits of ``ids`` under ``gguf_file``, ``[len(ids), vocab]`` float32 (a numpy array)."""
    import numpy as np

    return np.load(llamacpp_logits_files([gguf_file], ids, threads)[0])


def llamacpp_logits_files(gguf_files: list[Path], ids: list[int], threads: int = 1) -> list[Path]:
    """llama.cpp's logits of ``ids`` under each of ``gguf_files``, run in one process: one ``.logits.npy`` per file.

    ``[len(ids), vocab]`` float32 arrays, written next to each file; files rather than arrays, so that a caller
    comparing dozens of models holds one at a time.
    """
    outs = [f.with_suffix(".logits.npy") for f in gguf_files]
    jobs = json.dumps([[str(f), str(out)] for f, out in zip(gguf_files, outs)])
    run_llamacpp(RUN, gguf_files[0], ids, jobs, str(threads))
    return outs
