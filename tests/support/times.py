"""Timestamps of the tests of current facts: ten days ago, in microseconds."""

from __future__ import annotations

import time

MIN = 60_000_000  # one minute in microseconds


HOUR = 60 * MIN


NOW = time.time_ns() // 1000


T0 = NOW - 10 * 24 * HOUR  # the tenant tests' events happen ten days ago
