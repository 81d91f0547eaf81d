-- The control plane: tenants, keys, the audit log, the generation counter, and the nodes and
-- proxies of a cluster. Times are microseconds since the Unix epoch, written by the caller's
-- clock (as the LMDB backend does), never by now().

-- One row: the generation (moved by every change to tenants or keys) and the last audit seq.
-- Every writer locks this row first, so changes are serialised as in LMDB and seqs have no gaps.
CREATE TABLE control_meta (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    generation bigint NOT NULL,
    audit_seq bigint NOT NULL
);

CREATE TABLE tenants (
    tenant_id text PRIMARY KEY,
    name text NOT NULL UNIQUE,
    created_at bigint NOT NULL,
    route text NOT NULL UNIQUE,   -- the first characters of its key ids (memspine_admin/keys.py)
    node text                     -- the node that holds it; NULL when not placed
);

-- Keys outlive their tenant (revoked), so there is no foreign key to tenants.
CREATE TABLE keys (
    key_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    scopes text[] NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint,
    revoked_at bigint,
    secret_hash text NOT NULL
);
CREATE INDEX keys_by_tenant ON keys (tenant_id);

CREATE TABLE audit (
    seq bigint PRIMARY KEY,
    ts bigint NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    tenant_id text,
    key_id text,
    detail json NOT NULL   -- json, not jsonb: the detail reads back with its keys in order
);
CREATE INDEX audit_by_tenant ON audit (tenant_id, seq);

-- Servers started with MEMSPINE_NODE; tenants are placed on them.
CREATE TABLE nodes (
    name text PRIMARY KEY,
    registered_at bigint NOT NULL,
    seen_at bigint NOT NULL
);

-- Proxy map writers (memspine-admin proxy-sync): the generation each has applied, so a tenant's
-- creation can wait until every live proxy routes its keys.
CREATE TABLE proxies (
    name text PRIMARY KEY,
    applied_generation bigint NOT NULL,
    seen_at bigint NOT NULL
);
