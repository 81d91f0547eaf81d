-- Placement: where each node can be reached and what it holds (reported by the node itself),
-- and a tenant's move between nodes (memspine_admin/move.py).

-- Each node's advertised URL (memspine-admin tenant move talks to the nodes) and its own
-- figures, refreshed with its heartbeat: tenant directories on its disk, their bytes on disk,
-- tenants open now. The least-loaded placement reads them (memspine_admin/placement.py).
ALTER TABLE nodes
    ADD COLUMN url text,
    ADD COLUMN tenants bigint NOT NULL DEFAULT 0,
    ADD COLUMN bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN open_tenants integer NOT NULL DEFAULT 0,
    ADD COLUMN reported_at bigint;

-- A move of a tenant from `node` to `move_to` (copying), then back-pointed by `move_from` once
-- placement switched; `writes_held` refuses the tenant's writes (503) during the copy's tail.
ALTER TABLE tenants
    ADD COLUMN move_to text,
    ADD COLUMN move_from text,
    ADD COLUMN writes_held boolean NOT NULL DEFAULT false;
CREATE INDEX tenants_by_node ON tenants (node);
