"""`python -m workbench` runs the same CLI as the `vram-bench` script."""

import sys

from workbench.cli import main

sys.exit(main())
