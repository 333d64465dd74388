"""`python -m wgrumus`: the same as the `wgrumus` command."""
import sys

from .cli import main

sys.exit(main())
