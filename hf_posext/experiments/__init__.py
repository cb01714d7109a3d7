"""Experiments: runs that use the library to show or measure something, not part of the library.

`tinylm` (the tiny stdlib Llama), `demo` (``hf-posext demo``), `reproduce` (the
laptop reproduction). A new experiment is a module here, and its command a module of
`hf_posext.commands` (docs/results/reproduction.md).
"""
