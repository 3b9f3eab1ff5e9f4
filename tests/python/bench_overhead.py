"""Per-call overhead of the strata Python front end: the benchmark is bench/py_overhead.py (this name is kept
for test_overhead.py and for older notes).

    python tests/python/bench_overhead.py [--iters N] [--repeats R] [--out FILE]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from py_overhead import cases, main, measure  # noqa: E402,F401

if __name__ == "__main__":
    main()
