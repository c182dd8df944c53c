import sys

from dynamiccl.cli import main

sys.exit(main())
