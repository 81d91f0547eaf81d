"""Which node holds a new tenant: for now a deterministic rule over the registered nodes.

Interim: the tenant id's SHA-256, as an integer, modulo the number of nodes, picks a node from
their names in sorted order. The choice is recorded with the tenant (its `node`), so nodes that
join later move no existing tenant. Choosing a node (`tenant create --node`) and the least-loaded
default replace this rule later; nothing else depends on it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

# A DNS label, as Kubernetes names StatefulSet pods (memspine-0) and HAProxy names backends.
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


def is_node_name(value: object) -> bool:
    """True if `value` can name a node: a lower-case DNS label (1-63 of a-z, 0-9 and -)."""
    return isinstance(value, str) and NODE_NAME.match(value) is not None


def interim_node(tenant_id: str, nodes: Sequence[str]) -> str | None:
    """The node a new tenant goes to under the interim rule, or None when there is none."""
    if not nodes:
        return None
    ordered = sorted(nodes)
    digest = int.from_bytes(hashlib.sha256(tenant_id.encode()).digest()[:8], "big")
    return ordered[digest % len(ordered)]
