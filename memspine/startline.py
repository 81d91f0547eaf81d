"""The line `memspine-server` logs once it listens: where it is, which data directory, which
auth mode and what that means, the embedder, and that it is ready."""

from __future__ import annotations

import logging
import socket
from typing import Any

import uvicorn

from memspine import __version__
from memspine.config import Settings
from memspine_admin.control import ControlDB, control_path
from memspine_admin.controlurl import redact
from storage.datalock import client_url
from storage.embedders import describe

log = logging.getLogger("memspine.server")


def embedder(settings: Settings) -> str:
    """What turns text into embeddings for this server: the embedder its settings name."""
    return describe(
        settings.embedder, settings.embedder_url, settings.embedder_model, settings.embedding_dim
    )


def start_line(settings: Settings) -> tuple[str, dict[str, Any]]:
    """The one line logged once the server listens: where, which data, which auth, ready."""
    url = client_url(settings.host, settings.port)
    data_dir = settings.data_dir.resolve()
    if settings.control_url:
        auth = "issued keys"
        node = f", as node {settings.node}" if settings.node else ""
        means = (
            "only keys made by memspine-admin key create are accepted (control plane "
            f"{redact(settings.control_url)}{node})"
        )
    elif ControlDB.exists(data_dir):
        auth = "issued keys"
        means = (
            f"only keys made by memspine-admin key create are accepted ({control_path(data_dir)})"
        )
    else:
        auth = "local mode"
        means = (
            "no control database, so any well-formed token (letters, digits, - and _, or a "
            "UUID) is taken as a tenant id: a mistyped token is another, empty tenant; "
            "memspine-admin init switches to issued keys"
        )
    admin = "on" if settings.admin_key is not None else "off (MEMSPINE_ADMIN_KEY unset)"
    msg = (
        f"memspine-server {__version__} ready on {url}: data in {data_dir}; auth: {auth}, "
        f"{means}; admin routes {admin}; embedder: {embedder(settings)}"
    )
    fields = {"url": url, "data_dir": str(data_dir), "auth": auth, "embedder": embedder(settings)}
    return msg, fields


class ReadyServer(uvicorn.Server):
    """uvicorn's server, logging the start line once its socket listens (not before: a port
    in use fails after the app has started)."""

    def __init__(self, config: uvicorn.Config, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, then say so."""
        await super().startup(sockets)
        if self.started:
            msg, fields = start_line(self.settings)
            log.info(msg, extra=fields)
