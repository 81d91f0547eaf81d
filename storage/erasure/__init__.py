"""Purge: rewriting a tenant's files so its deleted events' bytes leave the disk.

purge.py runs it; compact.py is its LMDB side (a logical copy, then the writes since), swap.py
the on-disk protocol that replaces the files (staged generation, one rename, roll-forward).
"""
