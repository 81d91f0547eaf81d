-- Retention and legal holds (docs/erasure.md): a tenant's own windows, kind -> days ("*" for
-- the rest; NULL: none of its own, the server's MEMSPINE_RETENTION_DAYS applies), and the holds
-- that stop every deletion of what they keep (subject NULL: the whole tenant).
ALTER TABLE tenants ADD COLUMN retention json;

CREATE TABLE holds (
    hold_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    reason text NOT NULL,
    subject text,
    placed_at bigint NOT NULL,
    placed_by text NOT NULL
);
CREATE INDEX holds_by_tenant ON holds (tenant_id, placed_at);
