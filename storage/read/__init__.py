"""Reads over one snapshot of the log and the indexes: current state (current.py), listing
(listing.py), recall (recall.py), and what a delete would reach (cascade.py)."""
