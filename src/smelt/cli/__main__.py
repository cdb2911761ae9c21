"""`python -m smelt.cli ...`, the form torchrun launches (`torchrun ... -m smelt.cli train CONFIG`)."""

import sys

from smelt.cli import main

if __name__ == "__main__":
    sys.exit(main())
