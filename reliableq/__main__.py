"""`python -m reliableq` is the `reliableq` command."""

import sys

from reliableq.cli import main

sys.exit(main())
