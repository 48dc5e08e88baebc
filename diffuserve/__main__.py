"""`python -m diffuserve` runs the CLI."""

import sys

from diffuserve.cli.main import main

sys.exit(main())
