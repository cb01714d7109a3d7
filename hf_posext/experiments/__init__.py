"""Experiments: runs that use the library to show or measure something, not part of the library.

:mod:`.tinylm` (the tiny stdlib Llama), :mod:`.demo` (``hf-posext demo``), :mod:`.reproduce` (the
laptop reproduction). A new experiment is a module here, and its command a module of
:mod:`hf_posext.commands` (docs/results/reproduction.md).
"""
