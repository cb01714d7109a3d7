"""``python -m hf_posext ...`` is ``hf-posext ...``."""

import sys

from .commands.main import main

if __name__ == "__main__":
    sys.exit(main())
