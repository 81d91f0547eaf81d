"""Tenants: one open tenant and every operation on it (tenant.py), its writer's typed jobs
(jobs.py) fed by its single writer (writer.py) to the group commit (groupcommit.py), the index
projection (projection.py), its indexes opened or rebuilt by indexes.py, and the manager that
opens them within a count cap and a memory budget (manager.py, footprint.py), with an empty
stand-in for reads of tenants that do not exist (standin.py)."""
