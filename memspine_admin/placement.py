"""Which node holds a tenant, which node a new tenant goes to, and what a node may serve.

A tenant is owned by one node, recorded in the control plane (`tenants.node`). A new tenant
goes to the node named by `tenant create --node`, else to the least-loaded live node: the one
with the fewest bytes on disk, as the nodes report them with their heartbeat
(memspine_admin/control_pg.py), each tenant placed there since its last report counted as
NEW_TENANT_BYTES (a burst of creations spreads instead of piling on one node). A node serves a
tenant only if it owns it, or it is the source of a move that is switching (memspine_admin/
move.py): anything else is 421 `misdirected`, never an answer from an empty directory.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from storage.errors import MemspineError, Misdirected, Unavailable

# A DNS label, as Kubernetes names StatefulSet pods (memspine-0) and HAProxy names backends.
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
# What a tenant placed on a node but not yet in its report counts for (an empty tenant's files
# are far smaller; it is a tie-breaker that makes a burst of creations take turns).
NEW_TENANT_BYTES = 1 << 20
# A node whose heartbeat is older than this is not given new tenants (it may be down).
LIVE_SECS = 30.0
MISDIRECTED = (
    "this node does not hold the tenant of this key; send requests to the cluster's address "
    "(its proxy), not to a node"
)
MOVING = "the tenant is being moved to another node; its writes resume within seconds"
RETRY_AFTER_SECS = 1
# A move's hold on writes is a lease from its `hold` step (the audit's time of it): a move
# killed while it holds them does not refuse the tenant's writes for good. Before the switch
# writes resume on the source (the switch then refuses an expired hold: the move is given up);
# after it, on the target, which holds every write by then.
HOLD_LEASE_SECS = 60.0


def is_node_name(value: object) -> bool:
    """True if `value` can name a node: a lower-case DNS label (1-63 of a-z, 0-9 and -)."""
    return isinstance(value, str) and NODE_NAME.match(value) is not None


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a tenant is: its node, and the state of a move if one is under way."""

    node: str | None  # None: not placed (one node, or tenants made before nodes)
    move_to: str | None = None  # copying to this node; `node` still serves it
    move_from: str | None = None  # switched here from this node, which still serves reads
    writes_held: bool = False  # the move's tail: writes refused (503) wherever they arrive
    held_since: int | None = None  # µs: when the hold began (its lease runs from there)


def holding(placement: Placement, now_us: int) -> bool:
    """Whether the placement's hold on writes is in force (held, its lease not run out)."""
    if not placement.writes_held:
        return False
    since = placement.held_since
    return since is None or now_us - since <= HOLD_LEASE_SECS * 1e6


class NodeFigures(NamedTuple):
    """What a node reports of itself with its heartbeat."""

    tenants: int  # tenant directories on its disk
    bytes: int  # their bytes on disk (allocated blocks)
    open_tenants: int


class NodeLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A node's own figures (its last heartbeat) and how many tenants the plane placed on it."""

    name: str
    url: str | None = None
    tenants: int = 0  # tenant directories on its disk
    bytes: int = 0  # their bytes on disk
    open_tenants: int = 0
    placed: int = 0  # tenants whose `node` is this one
    seen_at: int = 0  # µs; its last heartbeat

    @property
    def load(self) -> int:
        """Bytes on disk as reported, plus NEW_TENANT_BYTES per tenant placed since."""
        return self.bytes + max(0, self.placed - self.tenants) * NEW_TENANT_BYTES


def least_loaded(nodes: Sequence[NodeLoad], now_us: int) -> str | None:
    """The node a new tenant goes to: the least load among nodes seen within LIVE_SECS (all
    of them if none was), then the fewest placed tenants, then the name; None without nodes."""
    if not nodes:
        return None
    live = [n for n in nodes if now_us - n.seen_at <= LIVE_SECS * 1e6] or list(nodes)
    return min(live, key=lambda n: (n.load, n.placed, n.name)).name


def refusal(placement: Placement | None, node: str | None, *, write: bool) -> MemspineError | None:
    """Why `node` must not serve a request for a tenant placed so, or None if it may.

    A server that is not a cluster node, an unknown tenant (authentication answers that) and
    an unplaced tenant are served as on one machine.
    """
    if node is None or placement is None or placement.node is None:
        return None
    if node == placement.node or node == placement.move_from:
        if write and (holding(placement, time.time_ns() // 1000) or node != placement.node):
            return Unavailable(MOVING, headers={"Retry-After": str(RETRY_AFTER_SECS)})
        return None
    return Misdirected(MISDIRECTED)
