"""A moved tenant's read records follow it: the node it left hands them over when it erases its
copy, the node it is on takes them in before its own (docs/audit.md, docs/scaling.md).

The node that erases a copy a move took away (the move's last step, memspine/routes/move.py's
erase, or the leftover sweep, memspine/leftovers.py) first writes what its writer holds of the
tenant, then asks the tenant's node to take the records: that node reads this one's read log
(GET /v1/admin/move/{id}/reads, refused while this node serves the tenant) and puts it in place,
chaining after it the records it made since the switch (storage/readlog/logfile.py's
take_carried). Only then is the copy erased; a failure keeps it, and the sweep tries again.
The chain on the new node so starts with the old node's, byte for byte: every head the old
node recorded in the control plane is a head of it, and verify passes there. From the move's
first copy until then the new node keeps a note that the records are still to come (the
target's pull, memspine/routes/move.py; removed here once they are in and their head recorded),
and verify there says the move is in progress instead of judging a chain not yet whole.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import msgspec

from memspine.cluster import NodeGate
from memspine.engine import Engine
from storage import ReadLogCorrupt, carried_in, reads_path
from storage.errors import Unavailable

log = logging.getLogger("memspine.readmove")

FLUSH_SECS = 30.0
TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)


class TakeIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST …/reads: take the tenant's read records from `source`, the node it left."""

    source: str


class Taken(msgspec.Struct):
    """The read records taken: the chain's head here after them."""

    tenant_id: str
    seq: int


def serves(gate: NodeGate | None, tenant_id: str) -> bool:
    """Whether this node is the tenant's node (it records the chain's heads): always outside
    a cluster, and for a tenant placed nowhere."""
    if gate is None:
        return True
    _generation, placement = gate.placement(tenant_id)
    return placement is None or placement.node in (None, gate.node)


def node_url(gate: NodeGate, node: str) -> str:
    """A node's URL from the control plane (never from a caller)."""
    url = {n.name: n.url for n in gate.control.node_loads()}.get(node)
    if not url:
        raise Unavailable(f"node {node} has registered no URL (MEMSPINE_NODE_URL)")
    return str(url)


def hand_over(engine: Engine, gate: NodeGate, tenant_id: str, admin_key: str) -> bool:
    """Blocking, with the tenant held closed: write what the writer holds of the tenant and
    have its node take the records; False if there is nothing to hand (no read log, or the
    tenant is not on another node). Unavailable if the other node did not take them. With no
    read log here the node is still told, so it stops awaiting them (a failure to tell it
    keeps nothing: it only leaves its verify saying the move is in progress)."""
    placement = gate.control.placement(tenant_id)
    if placement is None or placement.node in (None, gate.node):
        return False
    reads = engine.reads.writer
    reads.flush().result(FLUSH_SECS)
    reads.forget(tenant_id)
    if not reads_path(engine.manager.path_of(tenant_id)).exists():
        try:
            _ask_to_take(gate, placement.node, tenant_id, admin_key)
        except Unavailable as exc:
            log.warning(
                "tenant %s: node %s not told it has no read records to await: %s",
                tenant_id,
                placement.node,
                exc,
            )
        return False
    _ask_to_take(gate, placement.node, tenant_id, admin_key)
    return True


def _ask_to_take(gate: NodeGate, node: str, tenant_id: str, admin_key: str) -> None:
    """Ask the tenant's node to take its read records from this one (POST …/reads)."""
    url = node_url(gate, node)
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        r = httpx.post(
            f"{url}/v1/admin/move/{tenant_id}/reads",
            json={"source": gate.node},
            headers=headers,
            timeout=TIMEOUT,
        )
    except httpx.HTTPError as exc:
        raise Unavailable(f"node {node} cannot be reached: {exc}") from None
    if r.status_code != 200:
        raise Unavailable(
            f"node {node} did not take the read records ({r.status_code} {r.text[:200]})"
        )


def take(engine: Engine, gate: NodeGate, tenant_id: str, source: str, admin_key: str) -> Taken:
    """Blocking: read the tenant's read log from `source` and put it in place here, this
    node's own records chained after it; the chain's head is recorded at once."""
    url = node_url(gate, source)
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        r = httpx.get(f"{url}/v1/admin/move/{tenant_id}/reads", headers=headers, timeout=TIMEOUT)
    except httpx.HTTPError as exc:
        raise Unavailable(f"node {source} cannot be reached: {exc}") from None
    if r.status_code != 200:
        raise Unavailable(f"node {source} refused its read records ({r.status_code})")
    root: Path = engine.manager.path_of(tenant_id)
    if not r.content:
        carried_in(root)
        return Taken(tenant_id, 0)
    try:
        mark = engine.reads.writer.carry(tenant_id, root, r.content).result(FLUSH_SECS)
    except ReadLogCorrupt as exc:
        raise Unavailable(f"the read log node {source} sent does not parse: {exc}") from None
    engine.reads.writer.flush().result(FLUSH_SECS)  # the new head replaces the old node's
    # Only now: a verify between the carry and the flush would judge the whole chain against
    # the head before it, and call a chain tampered that is not.
    carried_in(root)
    return Taken(tenant_id, mark.seq)
