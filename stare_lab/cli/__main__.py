"""`python -m stare_lab.cli`: the `stare-lab` command."""

import sys

from stare_lab.cli import main

sys.exit(main())
