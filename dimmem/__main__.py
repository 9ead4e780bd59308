import sys

from dimmem.cli import main

sys.exit(main())
