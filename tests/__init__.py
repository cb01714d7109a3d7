"""hf-posext's tests: a package, so that its helpers import as ``tests.helpers.<module>``."""
