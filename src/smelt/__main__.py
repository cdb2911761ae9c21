"""`python -m smelt ...`: the same command line as the `smelt` script, for a Python whose package is on
PYTHONPATH rather than installed (a GPU machine's system Python, a checkout without `pip install`)."""

import sys

from smelt.cli import main

if __name__ == "__main__":
    sys.exit(main())
