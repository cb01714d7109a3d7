"""Developer shim: ``python scripts/make_tiny_model.py ARGS`` is ``hf-posext tiny-model ARGS``."""

import sys

from hf_posext.commands.main import main

if __name__ == "__main__":
    sys.exit(main(["tiny-model", *sys.argv[1:]]))
