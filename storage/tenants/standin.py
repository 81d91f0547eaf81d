"""The empty tenant that answers reads of tenants that do not exist, so a read creates nothing."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from storage.tenants.tenant import Tenant

log = logging.getLogger("memspine.standin")


class _NoWrites:
    """The stand-in's writer: every tenant that does not exist reads through the one stand-in,
    so a write reaching it would show in all of them; it fails instead."""

    def submit(self, _payload: Any) -> Future[Any]:
        """Refuse."""
        raise RuntimeError("the empty stand-in tenant takes no writes")

    def stop(self) -> None:
        """Nothing runs."""


class EmptyStandIn:
    """One real, empty, read-only tenant, opened on first use in a directory of its own."""

    def __init__(self, embedding_dim: int) -> None:
        self.embedding_dim = embedding_dim
        self._lock = threading.Lock()
        self._tenant: Tenant | None = None
        self._root: Path | None = None
        self._closed = False

    def get(self) -> Tenant:
        """The stand-in, opened if needed (blocking the first time); raises once closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the empty stand-in tenant is closed")
            if self._tenant is None:
                # Outside the data directory: nothing that lists tenants may ever see it.
                root = Path(tempfile.mkdtemp(prefix="memspine-empty-"))
                tenant = Tenant.open("empty", root / "tenant", embedding_dim=self.embedding_dim)
                tenant.writer.stop()
                tenant.writer = _NoWrites()  # type: ignore[assignment]
                self._tenant, self._root = tenant, root
            return self._tenant

    def close(self) -> None:
        """Close the stand-in and remove its directory; get() refuses from then on."""
        with self._lock:
            tenant, root = self._tenant, self._root
            self._tenant, self._root, self._closed = None, None, True
        if tenant is not None:
            try:
                tenant.close()
            except Exception:
                log.exception("closing the empty stand-in tenant failed")
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
