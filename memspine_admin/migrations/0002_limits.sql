-- Limits: a tenant's own max_events, max_bytes and max_memory (NULL: the server's default
-- applies), and a key's own requests per minute (NULL likewise).
ALTER TABLE tenants
    ADD COLUMN max_events bigint, ADD COLUMN max_bytes bigint, ADD COLUMN max_memory bigint;
ALTER TABLE keys ADD COLUMN requests_per_minute integer;
