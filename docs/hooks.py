"""mkdocs hook: serve the plots of ``benchmarks/results/`` at ``benchmarks/results/...`` in the site.

The plots are written by the benchmarks next to their JSON; copying them into ``docs/`` would let the
two drift apart. A page under ``docs/results/`` shows one as ``![x](../benchmarks/results/demo/demo.png)``.

A strict build (``strict: true``, ``--strict``) also fails on its warnings under ``--quiet`` (.ci/run): see
``on_config``.
"""

from __future__ import annotations

import logging
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


def on_config(config):
    """Let a strict build see its warnings under ``--quiet``.

    mkdocs 1.6's ``--quiet`` raises the ``mkdocs`` logger to ERROR: no warning is logged, so none is counted
    and ``--strict`` fails on none (an unresolved cross-reference, a broken link). Here a strict build logs
    warnings again (info stays quiet).
    """
    logger = logging.getLogger("mkdocs")
    if config["strict"] and logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    return config
