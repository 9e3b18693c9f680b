"""`python -m dt.bench.scaling` = `dt bench scaling`."""

import sys

# Import by name, not as __main__, so the workers' functions pickle by a name every
# worker process can import.
from dt.bench.scaling import main

sys.exit(main())
