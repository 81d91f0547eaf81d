"""memspine's storage: a tenant's log, indexes, reads and erasure, with no HTTP in it."""
