"""What a test needs from the machine, and what happens when the machine lacks it.

CI (``CI`` set, as ``.ci/run`` is run) has everything: root, mounts, apt-get, and the
real agent runtimes, installed from the package registries. There a missing
capability or runtime is a failure, so no test quietly proves nothing. Elsewhere (a
developer's machine without root or without network, say) the test skips and prints why.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Fail under CI, else skip, printing ``reason``: what is missing and why it cannot be had here."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"CI must be able to run this test, but: {reason}", pytrace=False)
    print(f"\nSKIP: {reason}", file=sys.stderr)
    pytest.skip(reason)
