"""Developer shim: ``python scripts/reproduce.py ARGS`` is ``hf-posext reproduce --out benchmarks/results ARGS``.

The repository keeps its reproduction under benchmarks/results; a later ``--out`` wins.
"""

import sys

from hf_posext.commands.reproduce import main

if __name__ == "__main__":
    sys.exit(main(["--out", "benchmarks/results", *sys.argv[1:]]))
