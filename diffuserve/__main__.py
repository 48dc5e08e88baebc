"""`python -m diffuserve` runs the CLI."""

import sys

from diffuserve.cli import main

sys.exit(main())
