"""`python -m stare_lab.sweep run|status FILE` (the same as `stare-lab sweep ...`)."""

import sys

from stare_lab.sweep.cli import main

sys.exit(main())
