"""docs/methods/adding-a-method.md's plugin examples as written: the tests run the page's own code."""

from __future__ import annotations

import re

from . import ROOT

PLUGIN_PAGE = ROOT / "docs" / "methods" / "adding-a-method.md"


def plugin_examples() -> list[str]:
    """The page's Python blocks that register methods, in order: the one-method plugin ``slow``, then a family."""
    fence = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
    return [body for body in fence.findall(PLUGIN_PAGE.read_text()) if "hf_posext.register_" in body]
