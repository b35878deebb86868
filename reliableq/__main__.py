"""`python -m reliableq` is the `reliableq` command."""

import sys

from reliableq.cli.main import main

sys.exit(main())
