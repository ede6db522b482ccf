"""What a test needs from the machine, and what happens when the machine lacks it.

CI (``CI`` set, as ``.ci/run`` is run) has everything: root, mounts, apt-get. There a
missing capability is a failure, so no test quietly proves nothing. Elsewhere (a
developer's machine without root, say) the test skips and says why.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Fail under CI, else skip; ``reason`` says what is missing and why it cannot be had here."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"CI must be able to run this test, but: {reason}", pytrace=False)
    pytest.skip(reason)
