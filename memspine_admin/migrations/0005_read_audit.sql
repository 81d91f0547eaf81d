-- Read audit (docs/audit.md): a key that must give the purpose of each read, and the marks of
-- each tenant's read chain a verify checks the tenant's read log against: the last head
-- recorded (seq and chain value) and the base of the last retention cut.
ALTER TABLE keys ADD COLUMN require_purpose boolean NOT NULL DEFAULT false;
CREATE TABLE read_marks (
    tenant_id text PRIMARY KEY,
    head_seq bigint,
    head_hash bytea,
    cut_seq bigint,
    cut_hash bytea
);
