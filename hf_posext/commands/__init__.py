"""The ``hf-posext`` command line: one module per sub-command, `main` the entry point.

Each module's ``add_parser(subparsers)`` registers its sub-command; `arguments` holds the
values every command parses the same way (``--set KEY=VALUE``, booleans, the error policy).
"""
