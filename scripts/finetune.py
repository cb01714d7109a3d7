"""Dev shim: ``python scripts/finetune.py ARGS`` is ``hf-posext finetune ARGS`` (:mod:`hf_posext.commands.finetune`)."""

import sys

from hf_posext.commands.finetune import main

if __name__ == "__main__":
    sys.exit(main())
