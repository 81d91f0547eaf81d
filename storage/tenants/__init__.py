"""Tenants: one open tenant and every operation on it (tenant.py), its writer's typed jobs
(jobs.py) queued on its writer (writer.py), a queue on the writer pool every tenant shares
(pool.py), for the group commit (groupcommit.py), the index projection (projection.py), its indexes opened or rebuilt by indexes.py, and the manager that
opens them within a count cap and a memory budget (manager.py, footprint.py), with an empty
stand-in for reads of tenants that do not exist (standin.py); the background embedder
(embedding.py), the server-embedding policy (serving.py) and re-embedding (reembed.py)."""
