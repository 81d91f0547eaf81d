"""Moving a tenant's data whole: the export format, export and import, backup and restore."""
