"""The family folders of `hf_posext.methods`, found, not listed, and imported in name order.

Importing a family folder registers it (its ``__init__.py`` calls [`register_method`][hf_posext.register_method] or
[`register_family`][hf_posext.register_family]), so importing this module registers every family; the package's face
imports it. Adding a method is adding a folder.
"""

import importlib
import pkgutil
import sys

#: The family folders found beside this module, in import order.
FAMILY_MODULES = tuple(
    importlib.import_module(f"{__package__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(sys.modules[__package__].__path__), key=lambda info: info.name)
    if info.ispkg and not info.name.startswith("_")
)
