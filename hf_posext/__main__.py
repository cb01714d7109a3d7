"""``python -m hf_posext ...`` is ``hf-posext ...``."""

import sys

from .commands.main import main

sys.exit(main())
