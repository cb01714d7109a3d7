"""Experiments: runs that use the library to show or measure something, not part of the library.

* :mod:`.tinylm` - pretrain a tiny byte-level Llama on the Python standard library (cached), the
  model every offline experiment extends;
* :mod:`.demo` - ``hf-posext demo``: that model extended by every method, perplexity by length;
* :mod:`.reproduce` - the laptop-sized reproduction of the ALiBi and YaRN papers
  (``hf-posext reproduce``).

A new experiment is a module here plus, if it is run from the shell, a sub-command module in
:mod:`hf_posext.commands` listed in :data:`hf_posext.commands.main.SUBCOMMAND_MODULES`.
"""
