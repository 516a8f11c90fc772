"""`python -m actors.cli ...` is `fbrl ...` (subprocess tests and benchmarks run it with the interpreter they use)."""

import sys

from actors.cli import main

sys.exit(main())
