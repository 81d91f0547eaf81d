"""The event log: one LMDB environment per tenant, the only source of truth.

layout.py is its on-disk format, eventlog.py its environment, write transactions and deletes
(EventLog), appender.py the append of events inside one transaction (Appender), revisions.py
the records changed after their append, reader.py reads one snapshot of it (LogReader).
"""
