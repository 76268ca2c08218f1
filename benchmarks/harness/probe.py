"""Child-process entry of the CPU memory probe: JSON request on stdin, JSON result on stdout.

Run by the benchmark (`measure.run_probe`), not by hand.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from .measure import probe_main

    request = json.loads(sys.stdin.read())
    result = probe_main(request)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
