"""Counters the reliability tests fill and the summary prints (see conftest.pytest_terminal_summary)."""

from __future__ import annotations

import collections

#: faults injected, by kind (disk full, fsync error, runtime crash, ...)
FAULTS: collections.Counter[str] = collections.Counter()
