"""``python -m tfm_solution``: see ``tfm_solution.cli``."""

import sys

from .cli import main

sys.exit(main())
