"""`python -m app.cli ...` (and `accelerate launch -m app.cli ...`) is the `rubricem` command."""

import sys

from app.cli.main import main

sys.exit(main())
