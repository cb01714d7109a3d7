"""Write the list of supported model types (docs/methods/index.md) from hf_posext.architectures.SUPPORTED_MODEL_TYPES.

The list is what tests/test_architectures.py passes on (a test there keeps the page equal to it).
Usage: python scripts/supported_models.py            # rewrite the block in docs/methods/index.md
       python scripts/supported_models.py --check    # exit 1 if the page is stale
"""

from __future__ import annotations

import pathlib
import re
import sys
import textwrap

from hf_posext.architectures import SUPPORTED_MODEL_TYPES
from hf_posext.files import write_text

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "methods" / "index.md"
BLOCK = re.compile(r"<!-- supported-models -->\n(?:.*?\n)?<!-- /supported-models -->", re.S)


def block() -> str:
    names = "\n".join(textwrap.wrap(", ".join(f"`{name}`" for name in SUPPORTED_MODEL_TYPES), 100))
    return f"<!-- supported-models -->\n{names}\n<!-- /supported-models -->"


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    if not BLOCK.search(text):
        print(f"{PAGE} has no <!-- supported-models --> block", file=sys.stderr)
        return 1
    updated = BLOCK.sub(lambda _: block(), text)
    if "--check" in argv:
        return 0 if updated == text else 1
    if updated != text:
        write_text(PAGE, updated)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
