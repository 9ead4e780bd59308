import sys

from serve.cli import main

sys.exit(main())
