"""``python -m grpokit.bench ARGS`` is ``grpokit bench ARGS``."""

import sys

from grpokit.bench.cli import main

sys.exit(main())
