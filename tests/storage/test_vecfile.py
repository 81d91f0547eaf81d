"""storage/index/vecfile.py is the one definition of a saved vector index's layout: what it says
matches what hnswlib writes, and the live-label sidecar is read and written only through it."""

from __future__ import annotations

from pathlib import Path

import hnswlib
import numpy as np
import pytest

from storage.index import vecfile, vectors


@pytest.mark.parametrize("dim", [4, 384])
def test_the_record_size_is_the_one_hnswlib_writes(tmp_path: Path, dim: int) -> None:
    index = hnswlib.Index(space="cosine", dim=dim)
    index.init_index(max_elements=16, M=vectors.M, ef_construction=vectors.EF_CONSTRUCTION)
    index.add_items(np.random.default_rng(1).standard_normal((3, dim)), [1, 2, 3])
    path = tmp_path / "v.hnsw"
    index.save_index(str(path))
    head = path.read_bytes()[: vecfile.HEADER.size]
    size_per_element = vecfile.HEADER.unpack_from(head, 0)[3]
    assert vecfile.record_bytes(vectors.M, dim) == size_per_element
    vecfile.check_saved(path)  # the whole file is where the header says
    labels, rows = vecfile.read_vectors(path, dim)
    assert sorted(labels.tolist()) == [1, 2, 3] and rows.shape == (3, dim)


def test_the_live_labels_round_trip_sorted(tmp_path: Path) -> None:
    sidecar = vecfile.live_path(tmp_path / "vectors.hnsw")
    assert sidecar.name == "vectors.hnsw.live.npy"
    assert vecfile.read_live(sidecar) is None  # none saved yet
    with open(sidecar, "wb") as fh:
        vecfile.write_live(fh, {9, 2, 5})
    live = vecfile.read_live(sidecar)
    assert live is not None and live.dtype == np.uint64 and live.tolist() == [2, 5, 9]


@pytest.mark.parametrize(
    "content",
    [b"not a numpy file", None],  # junk, and a well-formed array of another shape
)
def test_a_sidecar_it_cannot_read_is_a_vector_file_error(
    tmp_path: Path, content: bytes | None
) -> None:
    sidecar = tmp_path / "vectors.hnsw.live.npy"
    if content is None:
        np.save(sidecar, np.zeros((2, 2), dtype=np.uint64))
    else:
        sidecar.write_bytes(content)
    with pytest.raises(vecfile.VectorFileError):
        vecfile.read_live(sidecar)
