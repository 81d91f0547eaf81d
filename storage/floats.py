"""Embeddings as clients get them back: each stored float32 as its shortest decimal.

The log keeps a vector's values as float32s (storage/log/layout.py). A value sent as 0.1 is
stored as the float32 nearest to it, 0.100000001490116...; rendered as that double it would
come back as 0.10000000149011612. Every door that returns an embedding (the HTTP event view,
a Cypher node, an export line) renders it through `shortest` instead: the shortest decimal
that reads back as the same float32, so 0.1 comes back as 0.1, and any value as sent to
float32's precision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Significant digits tried, fewest first: 9 always round-trip a float32.
_DIGITS = np.arange(1, 10)[:, None]
# The powers of ten a double holds exactly: rounding at 10**k by one multiplication and one
# division by them is correctly rounded, so a decimal of 9 digits or fewer comes out as the
# double nearest it (which prints as that decimal).
_EXACT = 22
_POW10 = 10.0 ** np.arange(_EXACT + 1)


def shortest(values: Sequence[float]) -> list[float]:
    """Each value, taken as a float32, as the double nearest its shortest round-tripping
    decimal (what numpy prints for the float32)."""
    stored = np.asarray(values, dtype=np.float32)
    exact = stored.astype(np.float64)
    finite = np.isfinite(exact) & (exact != 0)
    with np.errstate(all="ignore"):
        magnitude = np.floor(np.log10(np.abs(np.where(finite, exact, 1.0)))).astype(np.int64)
        # One row per number of digits: each value rounded at that many significant digits.
        power = _DIGITS - 1 - magnitude
        up = _POW10[np.clip(power, 0, _EXACT)]
        down = _POW10[np.clip(-power, 0, _EXACT)]
        rounded = np.round(exact * up / down) * down / up
    fits = (np.abs(power) <= _EXACT) & (rounded.astype(np.float32) == stored)
    first = fits.argmax(axis=0)  # the fewest digits that read back as the float32
    # A value past 1e22 cannot be rounded at its first digits here (so a fit found at more
    # would not be the fewest); a tiny one not at its last, where it simply fits nowhere.
    found = fits[first, np.arange(stored.size)] & finite & (magnitude <= _EXACT)
    out = np.where(found, rounded[first, np.arange(stored.size)], exact)
    for i in np.flatnonzero(finite & ~found):  # past 10**±22 (rare in an embedding): numpy's
        out[i] = float(str(stored[i]))
    return out.tolist()  # type: ignore[no-any-return]
