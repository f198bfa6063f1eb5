import sys

from grpokit.cli import main

sys.exit(main())
