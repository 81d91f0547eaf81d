"""What control-plane tests share: a password hasher cheap enough for tests (argon2 at its
lowest cost) and a clock they set by hand."""

from __future__ import annotations

from argon2 import PasswordHasher

CHEAP_HASHER = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
T0 = 1_790_000_000_000_000  # microseconds since the epoch: where a Clock starts


class Clock:
    """A settable clock in microseconds, starting at T0."""

    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> int:
        return self.t
