import sys

from llft.cli import main

sys.exit(main())
