"""mkdocs hook: serve the plots of ``benchmarks/results/`` at ``benchmarks/results/...`` in the site.

The plots are written by the benchmarks next to their JSON; copying them into ``docs/`` would let the
two drift apart. A page under ``docs/results/`` shows one as ``![x](../benchmarks/results/demo/demo.png)``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent


def on_files(files, config):
    for png in sorted((ROOT / "benchmarks" / "results").rglob("*.png")):
        if "work" in png.relative_to(ROOT).parts:
            continue
        files.append(
            File(
                str(png.relative_to(ROOT)),
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
