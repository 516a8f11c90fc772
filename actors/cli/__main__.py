"""`python -m actors.cli ...` is `fbrl ...` (subprocess tests and benchmarks run it with the interpreter they use)."""

from actors.cli import entry

entry()
