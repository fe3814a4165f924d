"""``python -m minikafka``: the same as ``purgatory-sim``."""

import sys

from .cli import main

sys.exit(main())
