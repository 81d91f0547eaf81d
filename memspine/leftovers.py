"""A cluster node erases the copies it still holds of tenants a move took elsewhere: what a
`tenant move` killed between its switch and its erase left on the source, and what a move
given up on its way here left on the target (docs/scaling.md).

At start and every SWEEP_SECS (the node's heartbeat), the node asks the control plane which of
the tenant directories on its disk a move switched away from it (the audit's switch step names
the source) or abandoned before it arrived (the abort step names the target). Such a copy is
erased once the tenant serves from another node alone: the move finished, or its hold on
writes ran out (the sweep then finishes the move in the plane, as the move command would), or
it was given up. The node's own tenants, a copy being made here, and tenants no move took
away or abandoned here are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from functools import partial
from pathlib import Path

from memspine.cluster import NodeGate
from memspine.engine import Engine
from memspine.readmove import hand_over
from memspine_admin.placement import Placement, holding
from memspine_admin.records import now_us
from storage import is_tenant_id, sweep_stale
from storage.errors import MemspineError

log = logging.getLogger("memspine.leftovers")

SWEEP_SECS = 5.0  # as the node's heartbeat (memspine_admin/control_pg.py's HEARTBEAT_SECS)


def left_over(placement: Placement, node: str, now: int) -> bool:
    """Whether this node's copy of a tenant a move switched away from it may go: the tenant
    is on another node and this node serves it no more (a switched move's hold ended)."""
    if placement.node in (None, node) or placement.move_to == node:
        return False
    return placement.move_from != node or not holding(placement, now)


class Leftovers:
    """Finds and erases this node's copies of tenants moved away from it, or abandoned on
    their way to it."""

    def __init__(self, engine: Engine, gate: NodeGate, data_dir: Path, admin_key: str = "") -> None:
        """admin_key: the cluster's, to hand a copy's read records to the tenant's node."""
        self.engine = engine
        self.gate = gate
        self.data_dir = data_dir
        self.admin_key = admin_key
        self.erased: list[str] = []  # tenants whose copy this node erased

    def sweep(self) -> list[str]:
        """Blocking: erase what moves left here; the tenant ids erased now."""
        try:
            local = [e.name for e in os.scandir(self.data_dir) if is_tenant_id(e.name)]
        except FileNotFoundError:
            return []
        node = self.gate.node
        done = []
        for tenant_id, placement in self.gate.control.moved_away(node, local).items():
            if not left_over(placement, node, now_us()):
                continue
            try:
                if placement.move_from == node:  # the move was killed before its finish
                    self.gate.control.finish_move(tenant_id, actor=f"node:{node}")
                handing = partial(hand_over, self.engine, self.gate, tenant_id, self.admin_key)
                self.engine.erase_copy(tenant_id, handing)  # its read records to its node first
                sweep_stale(self.data_dir, tenant_id)
            except MemspineError as exc:  # changed meanwhile: the next sweep looks again
                log.info("tenant %s: copy left by a move not erased now: %s", tenant_id, exc)
                continue
            self.gate.release(tenant_id)
            log.warning(
                "erased this node's copy of tenant %s, left by a move (it is on %s)",
                tenant_id,
                placement.node,
            )
            done.append(tenant_id)
        self.erased.extend(done)
        return done

    async def run(self) -> None:
        """Sweep at once, then every SWEEP_SECS, until cancelled."""
        while True:
            with contextlib.suppress(Exception):  # a plane out of reach: the next sweep
                await asyncio.to_thread(self.sweep)
            await asyncio.sleep(SWEEP_SECS)
