"""A module for a zygote to preload in the tests (``GPULAYER_ZYGOTE_PRELOAD``): it makes a
finalizer at import that writes to stdout. A job forked from that zygote must not run it at its
exit (it is the zygote's, and a fresh interpreter's job would not have it), while the job's own
finalizers run (``worker/jobproc.py``'s ``exit_job``)."""

from __future__ import annotations

import os
import weakref


class _Held:
    pass


HELD = _Held()
weakref.finalize(HELD, os.write, 1, b"the zygote's finalizer ran\n")
