"""Moving a tenant's data whole: the export format, export and import, backup and restore.

The API, for the server, memspine-admin (memspine_admin/data.py) and anything that moves a
tenant between data directories or nodes:

Export (storage/transfer/export.py), lines of the format in storage/transfer/format.py:
- `tenant_export(tenant, tenant_id=None)`: a context manager yielding the lines of an open
  Tenant's export from one snapshot (in the process that has it open: the server);
  `write_export(tenant, out, tenant_id=None)` writes them to a binary file, returning its size.
  The snapshot holds the tenant's log lock shared: write to local disk, not to a slow peer
  (memspine/routes/transfer.py spools, then streams).
- `dir_export(root, tenant_id)`: the same from the tenant directory `root` in a process that
  does not have it open (a CLI beside the server; LMDB lets it read without any lock the
  server waits for). NotFound if there is no tenant there.

Import (storage/transfer/landing.py):
- `import_tenant(data_dir, tenant_id, stream, *, merge=False, progress=None) -> ImportStats`:
  loads an export from a binary stream into DATA_DIR/<tenant_id>, all of it or (refused,
  killed) nothing. Every refusal is storage.errors.InvalidRequest naming the line (a damaged,
  truncated or reordered file), or Conflict (a tenant holding events, without merge). A
  tenant with no directory is built beside it and renamed in, so this may run while a server
  serves data_dir; into a tenant with a directory, nothing may have it open meanwhile (in the
  server: hold `TenantManager.exclusive(tenant_id)` around the call). The file's tenant id
  need not be tenant_id; keep it the same so Idempotency-Key replays stay valid.

Backup and restore (storage/transfer/backup.py):
- `backup(data_dir, dest, *, environments=(), progress=None) -> BackupStats`: a hot copy of
  every tenant's log (plus each named LMDB environment, such as the control database) into
  the new directory dest, from a process that does not serve data_dir.
- `restore(src, data_dir, *, default_dim=384, progress=None) -> BackupStats`: a new data
  directory from a backup, indexes rebuilt from the logs.

Progress callbacks are told counts of events; none of these read more than a batch into memory.
"""
