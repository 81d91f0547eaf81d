"""Properties of the two arms on a real tenant: the vector arm is exact cosine top-k, and a keyword
arm restricted by kind returns exactly the matching events of that kind."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.index import vectors as vectors_module
from storage.index.flat import FlatSet, top, unit
from storage.model import AppendResult, NewEvent
from storage.read import recall as recall_module
from storage.read.current import Moment
from storage.read.recall import Admission, RecallQuery, keyword_arm, vector_arm
from storage.tenants.tenant import Tenant
from tests.support.budget import size

DIM = 3
KINDS = ("turn", "fact", "tool_call")
# Words whose English stems are all distinct, so "contains the word" is what BM25 matches.
VOCAB = (
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "ember",
    "quartz",
    "falcon",
    "lantern",
    "cobalt",
)

# How the vector arm may answer: exactly from the log's indexes (a kind admits few), from an
# unfiltered graph search checked after (over-fetch), or from a filtered graph search.
PLANS = {"few": (10_000, 32), "overfetch": (0, 32), "filter": (0, 1)}

pytestmark = pytest.mark.long  # property runs, sized by SETTINGS and size()

SETTINGS = settings(
    max_examples=size(25, 10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def open_tenant(root: Path) -> Tenant:
    """A fresh tenant (hypothesis runs many examples in one test, so tmp_path cannot be used)."""
    return Tenant.open("props", root, embedding_dim=DIM)


def append(t: Tenant, events: list[NewEvent]) -> list[str]:
    """Append in one group commit and return the ids."""
    results = t.submit_append(events).result()
    assert all(isinstance(r, AppendResult) for r in results)
    return [r.event_id for r in results]


def cosine(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row with the query (zero vectors score 0)."""
    norms = np.linalg.norm(vectors, axis=1) * (np.linalg.norm(query) or 1.0)
    return np.asarray((vectors @ query) / np.where(norms == 0, 1.0, norms))


def exact_top(vectors: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Cosine similarities of the exact top-k, best first."""
    return np.sort(cosine(vectors, query))[::-1][:k]


@st.composite
def vector_cases(draw: st.DrawFn) -> dict[str, object]:
    """A few hundred vectors (small integers, so ties, duplicates and zeros occur), a query,
    k, which to delete, which kind each is, and whether the graph has taken them in."""
    n = draw(st.integers(min_value=100, max_value=400))
    seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
    rng = np.random.default_rng(seed)
    vectors = rng.integers(-3, 4, size=(n, DIM)).astype(np.float32)
    if draw(st.booleans()):
        vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    return {
        "vectors": vectors,
        "query": rng.standard_normal(DIM).astype(np.float32),
        "k": draw(st.integers(min_value=1, max_value=60)),
        "deleted": rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5])),
        "kinds": rng.integers(0, len(KINDS), size=n),
        "kind": draw(st.sampled_from([None, *KINDS])),
        "inserted": draw(st.sampled_from(["tail", "graph", "half"])),
        "graph_search": draw(st.booleans()),
        "plan": draw(st.sampled_from(sorted(PLANS))),
    }


@SETTINGS
@given(case=vector_cases())
def test_vector_arm_top_k_is_exact_cosine_top_k(case: dict[str, object]) -> None:
    vectors = case["vectors"]
    assert isinstance(vectors, np.ndarray)
    kinds, deleted = np.asarray(case["kinds"]), np.asarray(case["deleted"])
    query, k, kind = np.asarray(case["query"]), int(case["k"]), case["kind"]  # type: ignore[call-overload]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        if case["graph_search"]:  # the HNSW graph, not the small-tenant scan
            mp.setattr(vectors_module, "EXACT_BELOW", 0)
        few, overfetch = PLANS[str(case["plan"])]
        mp.setattr(recall_module, "FEW", few)
        mp.setattr(recall_module, "OVERFETCH", overfetch)
        t = open_tenant(Path(tmp))
        try:
            half = len(vectors) // 2 if case["inserted"] == "half" else len(vectors)
            events = [
                NewEvent(kind=KINDS[kinds[i]], ts=i, embedding=[float(x) for x in vectors[i]])
                for i in range(len(vectors))
            ]
            ids = append(t, events[:half])
            if case["inserted"] != "tail":
                t.vectors.flush()
            ids += append(t, events[half:])
            gone = [ids[i] for i in range(len(ids)) if deleted[i]]
            if gone:
                assert t.submit_delete(gone).result() == gone
            q = RecallQuery(embedding=[float(x) for x in query], kind=kind, k=k)  # type: ignore[arg-type]
            with t.log.reader() as r:
                got = vector_arm(t.vectors, Admission(r, q, Moment(r)), k)
            keep = ~deleted & (True if kind is None else kinds == KINDS.index(str(kind)))
            want = exact_top(vectors[keep], query, k)
            # The arm reads records without their embeddings: look each up in what was appended.
            appended = {event_id: i for i, event_id in enumerate(ids)}
            got_vectors = vectors[[appended[e.event_id] for e in got]].reshape(-1, DIM)
            assert len(got) == len(want)
            assert all(e.kind == kind for e in got) if kind is not None else True
            np.testing.assert_allclose(exact_top(got_vectors, query, k), want, atol=1e-5)
            # The arm's own order is by similarity, best first.
            sims = [float(s) for s in cosine(got_vectors, query)]
            assert all(a >= b - 1e-6 for a, b in itertools.pairwise(sims))
        finally:
            t.close()


@st.composite
def keyword_cases(draw: st.DrawFn) -> dict[str, object]:
    """Events of random kinds with texts of vocabulary words, a query of a few words, a kind, depth."""
    docs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(KINDS),
                st.lists(st.sampled_from(VOCAB), min_size=0, max_size=6),
            ),
            min_size=30,
            max_size=300,
        )
    )
    return {
        "docs": docs,
        "query": draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=3)),
        "kind": draw(st.sampled_from(KINDS)),
        "depth": draw(st.integers(min_value=1, max_value=40)),
        "deleted": draw(st.sets(st.integers(min_value=0, max_value=299), max_size=40)),
    }


@SETTINGS
@given(case=keyword_cases())
def test_keyword_arm_restricted_by_kind_returns_exactly_the_matches_of_that_kind(
    case: dict[str, object],
) -> None:
    docs: list[tuple[str, list[str]]] = case["docs"]  # type: ignore[assignment]
    words: list[str] = case["query"]  # type: ignore[assignment]
    kind, depth = str(case["kind"]), int(case["depth"])  # type: ignore[call-overload]
    deleted: set[int] = {i for i in case["deleted"] if i < len(docs)}  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as tmp:
        t = open_tenant(Path(tmp))
        try:
            events = [NewEvent(kind=k, ts=i, text=" ".join(ws)) for i, (k, ws) in enumerate(docs)]
            ids = append(t, events)
            if deleted:
                t.submit_delete([ids[i] for i in sorted(deleted)]).result()
            q = RecallQuery(text=" ".join(words), kind=kind)
            with t.log.reader() as r:
                got = keyword_arm(t.keyword, Admission(r, q, Moment(r)), depth)
            matching = {
                ids[i]
                for i, (k, ws) in enumerate(docs)
                if k == kind and i not in deleted and set(ws) & set(words)
            }
            assert all(e.kind == kind for e in got)
            assert {e.event_id for e in got} <= matching
            assert len(got) == min(depth, len(matching))
            assert len({e.event_id for e in got}) == len(got)
        finally:
            t.close()


@SETTINGS
@given(
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=400),
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 70),
)
def test_a_flat_set_searches_like_a_plain_dict_of_unit_rows(
    ops: list[tuple[bool, int]], seed: int, k: int
) -> None:
    rng = np.random.default_rng(seed)
    flat, model = FlatSet(DIM), {}
    for is_put, label in ops:
        if is_put:
            row = rng.integers(-2, 3, size=DIM).astype(np.float32)  # zeros and ties included
            flat.put([label], row[None, :])
            model[label] = unit(row)
        else:
            popped = flat.pop(label)
            assert (popped is None) == (model.pop(label, None) is None)
    assert sorted(flat.labels()) == sorted(model) and len(flat) == len(model)
    query = unit(rng.standard_normal(DIM).astype(np.float32))
    labels = np.asarray(sorted(model), dtype=np.int64)
    # Equal similarities may tie-break differently (BLAS rounding differs by row position), so
    # compare the similarity sequence and that each label really has its similarity.
    for allowed in (None, lambda lb: lb % 2 == 1):
        keep = [lb for lb in labels.tolist() if allowed is None or allowed(lb)]
        sub = np.asarray([model[lb] for lb in keep], dtype=np.float32).reshape(-1, DIM)
        want = top(np.asarray(keep, dtype=np.int64), sub @ query, k) if keep else []
        got = flat.search(query, k, allowed)
        assert len(got) == len(want) and len({lb for lb, _s in got}) == len(got)
        np.testing.assert_allclose([s for _l, s in got], [s for _l, s in want], atol=1e-6)
        for lb, sim in got:
            assert (allowed is None or allowed(lb)) and abs(float(model[lb] @ query) - sim) < 1e-6
    if model:
        np.testing.assert_allclose(flat.rows(list(model)), np.stack(list(model.values())))


@settings(max_examples=size(200, 50), deadline=None)
@given(
    st.lists(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32), min_size=1, max_size=64
    )
)
def test_one_vector_is_made_unit_exactly_as_a_row_is(values: list[float]) -> None:
    """unit()'s one-vector path gives the bytes of the row path (a query and the rows it is
    compared with are scaled alike); a zero vector stays zero."""
    v = np.asarray(values, dtype=np.float32)
    as_row = unit(v[None, :])[0]
    one = unit(v)
    assert one.dtype == np.float32 and one.tobytes() == as_row.tobytes()
