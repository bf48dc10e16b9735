"""How many examples the heaviest property tests try.

The normal run (``bash tools/check``, CI) keeps them to what fits its time budget;
``FABRIC_TEST_DEPTH=deep python -m pytest tests/push tests/store tests/protocol`` searches four
times as far (the same tests, more examples), for a soak before a release.
"""

from __future__ import annotations

import os

DEEP = os.environ.get("FABRIC_TEST_DEPTH", "") == "deep"


def examples(normal: int) -> int:
    """``normal`` examples in the normal run, four times as many under ``FABRIC_TEST_DEPTH=deep``."""
    return normal * 4 if DEEP else normal
