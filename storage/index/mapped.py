"""A file mapped read-only that holds no file descriptor: Python's mmap keeps a duplicate of one
for as long as the map lives (an open tenant's mapped vector file would cost a descriptor of its
own), so the map is made through the C library and unmapped when the last view of it goes."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import weakref
from typing import Any

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_PyBUF_READ = 0x100
_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_from_memory.restype = ctypes.py_object
_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_libc: Any | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    _libc.munmap.restype = ctypes.c_int
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
except (OSError, AttributeError):  # no C library to call: Python's mmap (and its descriptor)
    _libc = None
_FAILED = ctypes.c_void_p(-1).value


def map_file(fd: int, size: int) -> Any:
    """The first size bytes of the open file fd, mapped read-only, as an object with the buffer
    protocol; unmapped once it and every view of it are gone. The caller may close fd at once."""
    if _libc is None or os.name != "posix":
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
    if addr is None or addr == _FAILED:
        code = ctypes.get_errno() or errno.ENOMEM
        raise OSError(code, os.strerror(code))
    # A memoryview of the pages (it takes weak references, so it can carry the finalizer that
    # unmaps them; numpy's views hold it through the buffer they took from it).
    pages = _from_memory(addr, size, _PyBUF_READ)
    weakref.finalize(pages, _libc.munmap, addr, size)
    return pages
