"""The two projections of the log that recall ranks with, each rebuilt from the log when lost.

keyword.py is the Tantivy BM25 index; vectors.py the hnswlib graph with its exact in-memory tail
(flat.py) and its saved file's layout (vecfile.py).
"""
