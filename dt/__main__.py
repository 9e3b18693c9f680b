"""`python -m dt ...` = `dt ...`."""

import sys

from dt.tools.cli import main

sys.exit(main())
