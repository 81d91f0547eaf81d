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


def _links_at(data: bytes) -> tuple[int, int]:
    """Where the upper-level link lists start in a saved file, and the first non-empty one."""
    count, record = vecfile.HEADER.unpack_from(data, 0)[2:4]
    start = vecfile.HEADER.size + count * record
    words = np.frombuffer(data[start:], dtype="<u4")
    return start, start + 4 * int(np.flatnonzero(words)[0])


def _with_length(data: bytes, at: int, change: int) -> bytes:
    value = int.from_bytes(data[at : at + 4], "little") + change
    return data[:at] + value.to_bytes(4, "little") + data[at + 4 :]


def test_the_link_check_refuses_what_hnswlib_refuses(tmp_path: Path) -> None:
    """check_links (run on open instead of loading a large graph) and hnswlib's load agree on
    a whole file and on files whose link lists are cut, padded or mislabelled."""
    dim = 8
    index = hnswlib.Index(space="cosine", dim=dim)
    index.init_index(max_elements=3000, M=vectors.M, ef_construction=vectors.EF_CONSTRUCTION)
    index.add_items(np.random.default_rng(2).standard_normal((3000, dim)), np.arange(3000))
    path = tmp_path / "v.hnsw"
    index.save_index(str(path))
    whole = path.read_bytes()
    _start, first = _links_at(whole)
    files = {
        "whole": whole,
        "cut by a word": whole[:-4],
        "cut by a list": whole[:-68],
        "a word more": whole + b"\0\0\0\0",
        "a length 4 longer": _with_length(whole, first, 4),
        "a length one list longer": _with_length(whole, first, 68),
        "a length not in words": _with_length(whole, first, 2),
    }
    for name, data in files.items():
        path.write_bytes(data)
        try:
            hnswlib.Index(space="cosine", dim=dim).load_index(str(path))
            loads = True
        except RuntimeError:
            loads = False
        if loads:
            assert vecfile.check_links(path, dim) == 3000, name
        else:
            with pytest.raises(vecfile.VectorFileError):
                vecfile.check_links(path, dim)
    assert [n for n in files if n != "whole"]  # the damaged ones were refused above


@pytest.mark.parametrize("count", [0, 5])
def test_a_flat_save_is_a_file_hnswlib_loads_and_this_module_reads(
    tmp_path: Path, count: int
) -> None:
    dim = 8
    rng = np.random.default_rng(3)
    rows = flat_unit(rng.standard_normal((count, dim)).astype(np.float32))
    labels = np.arange(10, 10 + count, dtype=np.int64)
    path = tmp_path / "v.hnsw"
    with open(path, "wb") as fh:
        vecfile.write_flat(fh, labels, rows, vectors.M, vectors.EF_CONSTRUCTION)
    vecfile.check_saved(path)
    read_labels, read_rows = vecfile.read_vectors(path, dim)
    assert read_labels.tolist() == labels.tolist()
    assert np.array_equal(read_rows, rows)  # bit for bit
    loaded = hnswlib.Index(space="cosine", dim=dim)
    loaded.load_index(str(path))
    assert loaded.element_count == count
    if count:
        assert np.array_equal(np.asarray(loaded.get_items(labels.tolist()), np.float32), rows)
        assert vecfile.count_labels(path, [11, 99], dim) == 1
        assert vecfile.erase_labels(path, [11], dim) == 1
        assert not np.array_equal(vecfile.read_vectors(path, dim)[1][1], rows[1])
        with pytest.raises(RuntimeError):
            hnswlib_reloaded(path, dim).get_items([11])  # marked deleted, as hnswlib reads it


def flat_unit(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1, as the vector index keeps them."""
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def hnswlib_reloaded(path: Path, dim: int) -> hnswlib.Index:
    """The index saved at path, as hnswlib loads it."""
    index = hnswlib.Index(space="cosine", dim=dim)
    index.load_index(str(path))
    return index
