"""glibc's heap: fewer malloc arenas, and freed pages handed back to the OS (no-ops elsewhere)."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

# glibc's mallopt parameters (malloc.h): the number of arenas, and the size from which an
# allocation gets pages of its own (mmap) instead of a piece of the heap.
M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
# Every thread that allocates gets an arena of its own, up to eight per core: with a writer, the
# keyword fold, the HNSW inserter and a pool of read threads per tenant, a burst of large
# requests leaves free memory in a dozen arenas that glibc keeps. Four arenas keep contention low
# on the cores this server has and bound that scatter.
ARENAS = 4


class _Mallinfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (malloc.h), sizes as size_t."""

    _fields_ = [
        (field, ctypes.c_size_t)
        for field in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> Any | None:
    """The C library if it is glibc with mallinfo2 (2.33 on), malloc_trim and mallopt; else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallinfo2.restype = _Mallinfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None  # musl, macOS, an older glibc: the allocator's own policy stands
    return libc


_LIBC = _glibc()


def available() -> bool:
    """Whether this process's allocator is glibc, so that these calls do something."""
    return _LIBC is not None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas (call before the server's threads start); False if not glibc."""
    return _LIBC is not None and _LIBC.mallopt(M_ARENA_MAX, arenas) == 1


# glibc raises its mmap threshold (128 KB at first) to the size of any mapped block freed, up to
# 32 MB; from then on such blocks come from the heap. LMDB callocs a 2 MB dirty-page list for each
# environment it opens: mapped, untouched pages cost nothing; from the heap, calloc zeroes them
# all, and the neighbours' live objects keep them resident after the close. Tenants opened and
# closed in turn so held 2.5 MB an open tenant where the first opens held 0.6 MB
# (bench/RESULTS.md, "Cold tenants"). A fixed threshold keeps blocks of 1 MB and more mapped.
MMAP_THRESHOLD = 1 << 20


def pin_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Map every allocation of size bytes or more on its own, for good (no dynamic raise);
    False if not glibc."""
    return _LIBC is not None and _LIBC.mallopt(M_MMAP_THRESHOLD, size) == 1


def free_bytes() -> int:
    """Bytes in the heap's free chunks, resident or already returned by a trim; 0 if unknown."""
    return int(_LIBC.mallinfo2().fordblks) if _LIBC is not None else 0


def trim() -> bool:
    """Return the heap's free pages to the OS; True if any memory was released (the call
    releases the interpreter lock: ctypes drops it around foreign calls)."""
    return _LIBC is not None and _LIBC.malloc_trim(0) == 1
