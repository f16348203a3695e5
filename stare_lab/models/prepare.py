"""`python -m stare_lab.models.prepare` (make install runs it): converts the packaged real model now
(SmolLM2-135M-Instruct's GGUF, stare_lab.models.smollm2), else its first run does. Prints the folder, or
the one line of what is missing or corrupt (exit 2)."""

from __future__ import annotations

import sys

from stare_lab.models import smollm2


def main() -> int:
    try:
        print(smollm2.prepared_folder())
    except ValueError as e:
        print(f"stare-lab: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
