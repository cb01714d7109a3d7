"""Experiments: runs that use the library to show or measure something, not part of the library.

* :mod:`.tinylm` - pretrain a tiny byte-level Llama on the Python standard library (cached), the
  model every offline experiment extends;
* :mod:`.demo` - ``hf-posext demo``: that model extended by every method, perplexity by length;
* :mod:`.reproduce` - the laptop-sized reproduction of the ALiBi and YaRN papers
  (``scripts/reproduce.py``).

A new experiment is a module here plus, if it is run from the shell, a thin script in
``scripts/`` or a sub-command registered in :mod:`hf_posext.commands.main`.
"""
