"""Pass stdin through to stdout, line by line, and write each line to FILE with the seconds since START (a
`time.monotonic()` reading) in front: `... | python stamp_lines.py FILE START | ...`. summarize.py splits a
process's wall time by these timelines (start-up, evals, steps, teardown). Stdlib only."""

import sys
import time

out, start = open(sys.argv[1], "w"), float(sys.argv[2])
for line in sys.stdin:
    sys.stdout.write(line)
    sys.stdout.flush()
    out.write(f"{time.monotonic() - start:.2f}\t{line}")
    out.flush()
