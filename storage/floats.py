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

# Significant digits tried, fewest first (one row each): 9 always round-trip a float32.
_ROWS = 9
# The powers of ten a double holds exactly: rounding at 10**k by one multiplication and one
# division by them is correctly rounded, so a decimal of 9 digits or fewer comes out as the
# double nearest it (which prints as that decimal).
_EXACT = 22
_POW10 = 10.0 ** np.arange(_EXACT + 1)
_ROW_SCALE = _POW10[:_ROWS, None]  # 10**(digits - 1), per row


def shortest(values: Sequence[float]) -> list[float]:
    """Each value, taken as a float32, as the double nearest its shortest round-tripping
    decimal (what numpy prints for the float32)."""
    stored = np.asarray(values, dtype=np.float32)
    exact = stored.astype(np.float64)
    size = np.abs(exact)
    finite = np.isfinite(size) & (size != 0)
    with np.errstate(all="ignore"):
        magnitude = np.floor(np.log10(np.where(finite, size, 1.0))).astype(np.int64)
        if finite.any() and magnitude.min() >= -(_EXACT - _ROWS) and magnitude.max() <= 0:
            # Every value in [1e-13, 10), as embeddings are: each row's scale, 10**(digits - 1
            # - magnitude), is a product of two exact powers of ten, itself exact.
            scale = _ROW_SCALE * _POW10[-magnitude]
            rounded = np.round(exact * scale) / scale
            fits = rounded.astype(np.float32) == stored
            usable: np.ndarray = np.ones(1, dtype=bool)
        else:
            power = np.arange(_ROWS)[:, None] - magnitude
            up = _POW10[np.clip(power, 0, _EXACT)]
            down = _POW10[np.clip(-power, 0, _EXACT)]
            rounded = np.round(exact * up / down) * down / up
            fits = (np.abs(power) <= _EXACT) & (rounded.astype(np.float32) == stored)
            # A value past 1e22 cannot be rounded at its first digits here (so a fit found at
            # more would not be the fewest); a tiny one not at its last, where it fits nowhere.
            usable = magnitude <= _EXACT
    first = fits.argmax(axis=0)[None, :]  # the fewest digits that read back as the float32
    found = np.take_along_axis(fits, first, axis=0)[0] & finite & usable
    out = np.where(found, np.take_along_axis(rounded, first, axis=0)[0], exact)
    missing = finite & ~found
    if missing.any():  # past 10**±22 (rare in an embedding): numpy's own printing
        for i in np.flatnonzero(missing):
            out[i] = float(str(stored[i]))
    return out.tolist()  # type: ignore[no-any-return]
