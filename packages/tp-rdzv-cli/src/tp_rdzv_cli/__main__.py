"""``python -m tp_rdzv_cli``: the same as the ``tp-rdzv`` command."""

import sys

from .main import main

sys.exit(main())
