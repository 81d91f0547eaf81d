"""`memspine-admin tenant move ID --to NODE`: move a tenant to another node while it serves.

The steps, each recorded in the control plane (memspine_admin/control_pg.py) and each node's
part done by its /v1/admin/move routes (memspine/routes/move.py):

1. begin: the tenant stays on its node, which serves it as before; the target erases any copy
   left by an earlier try;
2. copy while writes go on: the target pulls the source's export (one snapshot), then rounds of
   what changed since the previous one (appends; deletes, purged on the target), until a round
   finds little (QUIET) or after MAX_ROUNDS;
3. hold writes (503 with Retry-After on every node), the source drains the writes in flight,
   the target pulls the last round: the only time writes are refused;
4. switch: the tenant is placed on the target and the proxies are waited for (every live proxy
   routes it there); the source still answers reads meanwhile from the same data, both copies
   being equal while writes are held;
5. finish: writes resume on the target, the source serves the tenant no more (421), then the
   source erases its copy.

A failure before the switch gives the move up (abort: the tenant stays, the target's copy is
erased); after it, running the command again finishes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec

from memspine_admin.control_pg import PgControl
from storage.errors import Conflict, MemspineError, NotFound, Unavailable

QUIET = 200  # a round that copied at most this many changes is followed by the held one
MAX_ROUNDS = 5  # rounds while writes go on, whatever they find
ACTOR = "cli:move"
TIMEOUT = httpx.Timeout(connect=10.0, read=3600.0, write=60.0, pool=10.0)

Say = Callable[[str], None]


class MoveReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a move did."""

    tenant_id: str
    source: str
    target: str
    events: int  # events written on the target, every round together
    deleted: int  # events deleted (and purged) on the target after being copied
    rounds: int
    held_secs: float  # how long the tenant's writes were refused
    erased: bool  # the source's copy was erased
    receipts: int = 0  # signed receipts the target took in the held round


def node_client(url: str, admin_key: str) -> httpx.Client:
    """An admin client of one node."""
    return httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=TIMEOUT
    )


class Mover:
    """Drives a tenant's move through the control plane and the two nodes' admin routes."""

    def __init__(
        self,
        control: PgControl,
        admin_key: str,
        *,
        say: Say | None = None,
        client: Callable[[str, str], httpx.Client] = node_client,
    ) -> None:
        """`say` gets one line per step (the CLI's progress on stderr)."""
        self.control = control
        self.admin_key = admin_key
        self.say = say or (lambda _line: None)
        self._client = client

    def _node(self, name: str) -> httpx.Client:
        urls = {n.name: n.url for n in self.control.node_loads()}
        if name not in urls:
            raise NotFound(f"no node named {name!r} is registered")
        url = urls[name]
        if not url:
            raise Conflict(f"node {name} has registered no URL (MEMSPINE_NODE_URL)")
        return self._client(url, self.admin_key)

    def _call(self, node: httpx.Client, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            r = node.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{node.base_url} cannot be reached: {exc}") from None
        if r.status_code != 200:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text[:200]
            raise Unavailable(f"{node.base_url}{path}: {r.status_code} {detail}")
        answer: dict[str, Any] = r.json()
        return answer

    def move(self, tenant_id: str, to: str) -> MoveReport:
        """Move the tenant to node `to` (or finish a move that switched already)."""
        placement = self.control.placement(tenant_id)
        if placement is None:
            raise NotFound("no tenant with that id")
        path = f"/v1/admin/move/{tenant_id}"
        if placement.move_from is not None:  # switched before the last run stopped: finish
            if placement.node != to:
                raise Conflict(f"the tenant switched to {placement.node}; finish that move first")
            self.say(f"finishing the move from {placement.move_from}")
            return self._finish(tenant_id, placement.move_from, to, 0, 0, 0, time.monotonic())
        source = placement.node
        if source is None:
            raise Conflict("the tenant is not placed on a node; there is nothing to move")
        with self._node(to) as target:
            if placement.move_to is None:
                self._call(target, "DELETE", path)  # a copy an earlier try left there
            self.control.begin_move(tenant_id, to, actor=ACTOR)
            try:
                if placement.move_to is not None:
                    self._call(target, "DELETE", path)  # resumed: start the copy afresh
                events = deleted = 0
                after = 0
                rounds = 0
                while True:
                    pulled = self._call(target, "POST", f"{path}/pull", json={"after": after})
                    rounds += 1
                    events += pulled["events"]
                    deleted += pulled["deleted"]
                    after = pulled["last_seq"]
                    self.say(
                        f"round {rounds}: {pulled['events']} events, {pulled['deleted']} deleted,"
                        f" up to op {after}"
                    )
                    if rounds > 1 and pulled["events"] + pulled["deleted"] <= QUIET:
                        break
                    if rounds >= MAX_ROUNDS:
                        break
                self.control.hold_writes(tenant_id, actor=ACTOR)
                held_at = time.monotonic()
                with self._node(source) as src:
                    drained = self._call(src, "POST", f"{path}/drain")
                # The held round brings the tenant's signed receipts along with the last ops.
                body = {"after": after, "receipts": True}
                pulled = self._call(target, "POST", f"{path}/pull", json=body)
                rounds += 1
                events += pulled["events"]
                deleted += pulled["deleted"]
                receipts = pulled.get("receipts", 0)
                if pulled["last_seq"] < drained["last_seq"]:
                    raise Unavailable("the last round did not reach the source's last op")
                self.say(
                    f"held round: {pulled['events']} events, {pulled['deleted']} deleted, "
                    f"{receipts} receipts"
                )
                self.control.switch_move(tenant_id, actor=ACTOR)
            except BaseException:
                self._abort(tenant_id, target, path)
                raise
        return self._finish(
            tenant_id, source, to, events, deleted, rounds, held_at, receipts=receipts
        )

    def _finish(
        self,
        tenant_id: str,
        source: str,
        target: str,
        events: int,
        deleted: int,
        rounds: int,
        held_at: float,
        *,
        receipts: int = 0,
    ) -> MoveReport:
        """Wait for the proxies, let writes resume on the target, erase the source's copy."""
        self.control.await_proxies()
        self.control.finish_move(tenant_id, actor=ACTOR)
        held = time.monotonic() - held_at
        self.say(f"switched to {target}: writes were held for {held:.3f} s")
        with self._node(source) as src:
            erased = bool(self._call(src, "DELETE", f"/v1/admin/move/{tenant_id}")["erased"])
        return MoveReport(
            tenant_id=tenant_id,
            source=source,
            target=target,
            events=events,
            deleted=deleted,
            rounds=rounds,
            held_secs=round(held, 4),
            erased=erased,
            receipts=receipts,
        )

    def _abort(self, tenant_id: str, target: httpx.Client, path: str) -> None:
        """Give the move up: the tenant stays where it is, the target's copy goes."""
        try:
            self.control.abort_move(tenant_id, actor=ACTOR)
            self._call(target, "DELETE", path)
            self.say("move given up: the tenant stays where it was")
        except MemspineError as exc:
            self.say(f"giving the move up failed too: {exc.detail} (run the move again)")

    def abort(self, tenant_id: str) -> None:
        """Give up a move that stopped before its switch (`tenant move ID --abort`)."""
        placement = self.control.placement(tenant_id)
        if placement is None:
            raise NotFound("no tenant with that id")
        if placement.move_to is None:
            raise Conflict("the tenant is not being moved")
        self.control.abort_move(tenant_id, actor=ACTOR)
        with self._node(placement.move_to) as target:
            self._call(target, "DELETE", f"/v1/admin/move/{tenant_id}")
