"""`python -m muongen ...` (and `torchrun -m muongen ...`) run the CLI."""

from __future__ import annotations

import sys

from muongen.cli import main

sys.exit(main())
