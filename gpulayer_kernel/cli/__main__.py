"""``python -m gpulayer_kernel.cli``: the same as the ``gpulayer`` script."""

from __future__ import annotations

import sys

from .main import main

sys.exit(main())
