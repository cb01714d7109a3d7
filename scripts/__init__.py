"""The repository's developer tooling, shared by the tests, the benchmarks and CI (not part of the library).

The docs' tables: tables.py (``python scripts/tables.py [--check]`` rewrites every marked block from the
committed benchmark results), pivot.py (the one renderer), readers_table.py (the compatibility table).
What tests and benchmarks both build: tiny_models.py (tiny models of four architectures), registry.py (every
causal LM of transformers' registry, tiny), sweep.py (the model-type sweep), vanilla.py (loading without
hf_posext), and the cached environments of other readers, built into the repository's .cache/:
transformers4_env.py (transformers 4.57) and llamacpp_env.py (a compiled llama.cpp). Imported as
``scripts.<module>`` with the repository root on ``sys.path`` (pytest's ``pythonpath``; the scripts add it).
"""

from pathlib import Path

#: The repository's root folder.
ROOT = Path(__file__).resolve().parents[1]
