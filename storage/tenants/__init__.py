"""Tenants: one open tenant and every operation on it (tenant.py, fed by its single writer in
writer.py, its indexes opened or rebuilt by indexes.py), and the manager that opens them within
a count cap and a memory budget (manager.py, footprint.py), with an empty stand-in for reads of
tenants that do not exist (standin.py)."""
