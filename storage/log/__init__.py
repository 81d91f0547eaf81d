"""The event log: one LMDB environment per tenant, the only source of truth.

layout.py is its on-disk format, eventlog.py writes it (EventLog, Appender), reader.py reads one
snapshot of it (LogReader).
"""
