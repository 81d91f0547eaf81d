"""The PostgreSQL control plane's schema migrations, applied in name order."""
