"""`python -m tokenmill ...`: the `tokenmill` command where no console script is installed (a
wheel installed with `pip install --target`, as on a GPU machine without network)."""

import sys

from tokenmill.cli import main

sys.exit(main())
