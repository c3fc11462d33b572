"""A silent HiGHS handle.

highspy's Python wrapper prints a licence banner on stdout (at C level) the
first time a ``Highs`` object is built in a process; that would corrupt
``shoal route --json``. We build the first one with fd 1 pointed at
/dev/null, and switch solver logging off on every handle.
"""

from __future__ import annotations

import os
import sys

import highspy

_banner_done = False


def new_highs(time_limit_s: float | None = None) -> highspy.Highs:
    """A Highs instance that writes nothing to stdout or stderr."""
    global _banner_done
    if not _banner_done:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _banner_done = True
    else:
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("random_seed", 0)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    return h
