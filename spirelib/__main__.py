"""`python -m spirelib ...`: the `spire` command line (`spirelib.cli`), as torchrun runs it."""

import sys

from spirelib.cli import main

sys.exit(main())
