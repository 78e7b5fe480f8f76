"""``python -m coordinator.cli``: the ``fleet`` command without its script."""

import sys

from coordinator.cli import main

sys.exit(main())
