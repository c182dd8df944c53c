"""``python -m dynamiccl.validate``: the kit without the rest of the CLI (bare GPU machines)."""
import sys

from .cli import main

sys.exit(main())
