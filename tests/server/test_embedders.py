"""Embedders: the real local model against the reference vectors, and the openai embedder
against a real OpenAI-compatible HTTP endpoint on a loopback port, failures included."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memspine.config import SettingsError, load_settings
from storage.embedders import Embedder, EmbedderError, make_embedder
from storage.embedders.bert_graph import MS, _dense, _Graph, row_zero_points
from storage.embedders.child import ChildEmbedder
from storage.embedders.local import DIM, MODEL_NAME, LocalEmbedder
from storage.embedders.openai_compat import OpenAIEmbedder, endpoint_url, retry_after_secs
from tests.support.endpoint import Endpoint, fake_vector
from tests.support.servers import REPO

# LoCoMo turns and questions with their reference vectors (tests/support/reference/README.md).
REFERENCE = Path(__file__).resolve().parents[1] / "support" / "reference" / "locomo-reference.npz"


# --- the local model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray]:
    """A handful of LoCoMo turns and questions (short, long, with captions) and their vectors."""
    z = np.load(REFERENCE)
    vecs = z["vectors"].astype(np.float32)
    return [str(t) for t in z["texts"]], vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEmbedder]:
    """The default local embedder, loaded once for the module."""
    emb = LocalEmbedder()
    emb.load()
    yield emb
    emb.close()


def test_local_vectors_match_the_reference_model(local: LocalEmbedder, reference: Any) -> None:
    texts, expected = reference
    got = local.embed(texts)
    assert got.shape == (len(texts), DIM) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = (got * expected).sum(axis=1)
    assert cosines.min() >= 0.999, cosines.round(5).tolist()
    assert local.name == MODEL_NAME and local.dim == 384
    assert isinstance(local, Embedder)


def test_batching_and_length_sorting_change_no_vector(local: LocalEmbedder, reference: Any) -> None:
    texts, _ = reference
    batched = local.embed(texts)
    one_by_one = np.stack([local.embed([t])[0] for t in texts])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)
    reversed_ = local.embed(texts[::-1])[::-1]
    np.testing.assert_allclose(batched, reversed_, atol=1e-4)
    assert local.embed([]).shape == (0, DIM)


def test_texts_are_truncated_at_256_tokens(local: LocalEmbedder) -> None:
    # "apple", "banana" and "cherry" are one word piece each: the tail starts at piece 201
    # (seen, within 256; the tokenizer file alone would cut at 128) or at piece 301 (not seen).
    a, b = local.embed(["apple " * 200 + "banana " * 50, "apple " * 200 + "cherry " * 50])
    c, d = local.embed(["apple " * 300 + "banana " * 50, "apple " * 300 + "cherry " * 50])
    assert float(a @ b) < 0.999
    assert float(c @ d) > 0.99999


def test_query_vectors_are_cached(local: LocalEmbedder) -> None:
    hits = local.queries.hits
    first = local.embed_query("how does Lena want status notes written?")
    again = local.embed_query("how does Lena want status notes written?")
    assert again is first and local.queries.hits == hits + 1
    assert not first.flags.writeable
    np.testing.assert_allclose(
        first, local.embed(["how does Lena want status notes written?"])[0], atol=1e-5
    )


def test_fp32_loads_once_under_concurrent_first_use(reference: Any) -> None:
    texts, expected = reference[0][:6], reference[1][:6]
    emb = LocalEmbedder(precision="fp32", threads=1)
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(emb.embed(texts))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert emb.loads == 1 and len(results) == 4
    for got in results:
        assert (got * expected).sum(axis=1).min() >= 0.9999
    emb.close()


def _int8_dense(x: np.ndarray, w: np.ndarray, outliers: tuple[int, ...]) -> np.ndarray:
    """One int8 dense layer of the graph builder, run by onnxruntime on `x`."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    g = _Graph()
    row_zero_points(g, "x")
    out, bias = _dense(g, "x", w, np.zeros(w.shape[0], np.float32), "d", True, outliers)
    g.node("Add", [out, bias], ["y"])
    h = onnx.helper
    graph = h.make_graph(
        g.nodes,  # type: ignore[arg-type]
        "dense",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", x.shape[-1]])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        g.inits,  # type: ignore[arg-type]
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])


def test_int8_dense_takes_outlier_channels_in_float() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((18, 64)).astype(np.float32)
    x[:, [3, 40]] *= 25.0  # two channels far above the rest, as after the LayerNorm
    w = rng.standard_normal((48, 64)).astype(np.float32)
    exact = x @ w.T

    def rel_err(got: np.ndarray) -> float:
        return float(np.abs(got - exact).max() / np.abs(exact).max())

    with_outliers = rel_err(_int8_dense(x, w, (3, 40)))
    without = rel_err(_int8_dense(x, w, ()))
    assert with_outliers < 0.01
    assert with_outliers < without / 3


def test_batches_hold_one_token_count_each_within_the_limits() -> None:
    emb = LocalEmbedder(max_batch_tokens=40, max_batch_rows=3)  # nothing is loaded
    lengths = np.array([5, 9, 5, 5, 5, 20, 9, 30, 5])
    order = np.argsort(lengths, kind="stable")
    batches = emb._batches(order, lengths)
    assert sorted(int(i) for b in batches for i in b) == list(range(len(lengths)))
    for rows in batches:
        assert len({int(lengths[i]) for i in rows}) == 1  # no padding: the graph has no mask
        assert len(rows) <= 3 and len(rows) * int(lengths[rows[0]]) <= 40
    assert [len(b) for b in batches] == [3, 2, 2, 1, 1]


def test_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    emb = LocalEmbedder(model_dir=tmp_path)
    with pytest.raises(EmbedderError) as err:
        emb.embed(["anything"])
    assert err.value.reason == "model_missing" and err.value.status == 503
    assert str(tmp_path) not in err.value.detail  # no path reaches a client


def test_importing_the_package_loads_no_model_runtime() -> None:
    code = (
        "import sys, storage.embedders as e\n"
        "emb = e.make_embedder('local')\n"
        "heavy = [m for m in ('onnxruntime', 'onnx', 'tokenizers') if m in sys.modules]\n"
        "assert not heavy and not emb.loaded, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- an OpenAI-compatible endpoint on loopback (tests/support/endpoint.py) ---------------------------


@pytest.fixture(scope="module")
def endpoint_server() -> Iterator[Endpoint]:
    ep = Endpoint()
    yield ep
    ep.close()


@pytest.fixture
def endpoint(endpoint_server: Endpoint) -> Endpoint:
    endpoint_server.script.clear()
    endpoint_server.requests.clear()
    endpoint_server.dim = 8
    return endpoint_server


def remote(ep: Endpoint, failures: list[str] | None = None, **kw: Any) -> OpenAIEmbedder:
    kw.setdefault("backoff", 0.01)
    on_failure = failures.append if failures is not None else None
    return OpenAIEmbedder(ep.url, "test-embed", "sk-test-secret", on_failure=on_failure, **kw)


def expected(texts: list[str], dim: int = 8) -> np.ndarray:
    v = np.array([fake_vector(t, dim) for t in texts], dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_batches_of_texts_become_requests_in_order(endpoint: Endpoint) -> None:
    emb = remote(endpoint, batch_size=32)
    assert emb.dim is None
    texts = [f"turn number {i}" for i in range(70)]
    got = emb.embed(texts)
    assert [len(r["body"]["input"]) for r in endpoint.requests] == [32, 32, 6]
    assert {r["path"] for r in endpoint.requests} == {"/v1/embeddings"}
    assert {r["body"]["model"] for r in endpoint.requests} == {"test-embed"}
    assert {r["auth"] for r in endpoint.requests} == {"Bearer sk-test-secret"}
    np.testing.assert_allclose(got, expected(texts), atol=1e-6)
    assert emb.dim == 8 and emb.name == "test-embed" and got.dtype == np.float32
    assert emb.embed([]).shape == (0, 8)
    emb.close()


def test_answers_are_put_back_in_input_order_by_index(endpoint: Endpoint) -> None:
    endpoint.script = [{"reverse": True}]
    emb = remote(endpoint)
    texts = ["first", "second", "third"]
    np.testing.assert_allclose(emb.embed(texts), expected(texts), atol=1e-6)


def test_a_500_is_retried_and_counted(endpoint: Endpoint) -> None:
    failures: list[str] = []
    endpoint.script = [{"status": 500}, {"status": 502}]
    emb = remote(endpoint, failures)
    np.testing.assert_allclose(emb.embed(["a", "b"]), expected(["a", "b"]), atol=1e-6)
    assert failures == ["http_5xx", "http_5xx"] and len(endpoint.requests) == 3
    assert emb.failures == {"http_5xx": 2} and emb.requests == 3


def test_a_failure_hook_that_raises_changes_nothing(endpoint: Endpoint) -> None:
    def broken(reason: str) -> None:
        raise RuntimeError("metrics are down")

    endpoint.script = [{"status": 500}]
    emb = OpenAIEmbedder(endpoint.url, "m", on_failure=broken, backoff=0.01)
    assert emb.embed(["a"]).shape == (1, 8) and emb.failures == {"http_5xx": 1}


def test_a_429_waits_as_long_as_retry_after_says(endpoint: Endpoint) -> None:
    failures: list[str] = []
    endpoint.script = [{"status": 429, "headers": {"Retry-After": "1"}}]
    emb = remote(endpoint, failures)
    start = time.monotonic()
    emb.embed(["a"])
    assert time.monotonic() - start >= 0.95  # not the 0.01 s back-off
    assert failures == ["http_429"] and len(endpoint.requests) == 2


@pytest.mark.timing
def test_a_retry_after_past_max_wait_is_handed_to_the_caller(endpoint: Endpoint) -> None:
    endpoint.script = [{"status": 503, "headers": {"Retry-After": "120"}}]
    emb = remote(endpoint, max_wait=5)
    start = time.monotonic()
    with pytest.raises(EmbedderError) as err:
        emb.embed(["a"])
    assert time.monotonic() - start < 2
    assert err.value.reason == "http_5xx" and err.value.retry_after == 120
    assert err.value.headers == {"Retry-After": "120"} and err.value.status == 503
    assert len(endpoint.requests) == 1


def test_a_timeout_is_retried_then_reported(endpoint: Endpoint, caplog: Any) -> None:
    failures: list[str] = []
    endpoint.script = [{"delay": 1.0}, {"delay": 1.0}]
    emb = remote(endpoint, failures, timeout=0.2, retries=1)
    with (
        caplog.at_level(logging.WARNING, logger="memspine.embedder"),
        pytest.raises(EmbedderError) as err,
    ):
        emb.embed(["private text of a user"])
    assert err.value.reason == "timeout" and failures == ["timeout", "timeout"]
    assert "endpoint" not in err.value.detail and "127.0.0.1" not in err.value.detail
    lines = [r for r in caplog.records if r.name == "memspine.embedder"]
    assert [r.levelname for r in lines] == ["WARNING", "ERROR"]
    assert all(r.reason == "timeout" and r.url == endpoint.url + "/embeddings" for r in lines)  # type: ignore[attr-defined]
    logged = " ".join(r.getMessage() + str(r.__dict__) for r in lines)
    assert "private text" not in logged and "sk-test-secret" not in logged


def test_a_wrong_dimension_is_an_error_and_never_returned(endpoint: Endpoint) -> None:
    failures: list[str] = []
    emb = remote(endpoint, failures)
    emb.embed(["learn the dimension"])
    endpoint.script = [{"dim": 7}]
    with pytest.raises(EmbedderError) as err:
        emb.embed(["now shorter"])
    assert err.value.reason == "dimension" and failures == ["dimension"]
    assert len(endpoint.requests) == 2 and emb.dim == 8  # not retried, not relearned
    assert emb.embed(["fine again"]).shape == (1, 8)

    preset = remote(endpoint, dim=16)
    with pytest.raises(EmbedderError, match="failed"):
        preset.embed(["the tenant said 16"])


@pytest.mark.parametrize(
    ("step", "reason"),
    [({"status": 401}, "http_4xx"), ({"drop": True}, "bad_answer"), ({"dim": 0}, "bad_answer")],
)
def test_answers_that_cannot_be_used_are_not_retried(
    endpoint: Endpoint, step: dict[str, Any], reason: str
) -> None:
    failures: list[str] = []
    endpoint.script = [step]
    with pytest.raises(EmbedderError) as err:
        remote(endpoint, failures).embed(["a", "b"])
    assert err.value.reason == reason and failures == [reason] and len(endpoint.requests) == 1


def test_an_endpoint_that_is_down_is_a_connect_failure() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]
    failures: list[str] = []
    emb = OpenAIEmbedder(
        f"http://127.0.0.1:{port}", "m", on_failure=failures.append, retries=2, backoff=0.01
    )
    with pytest.raises(EmbedderError) as err:
        emb.embed(["a"])
    assert err.value.reason == "connect" and failures == ["connect"] * 3


def test_remote_query_vectors_are_cached(endpoint: Endpoint) -> None:
    emb = remote(endpoint)
    first = emb.embed_query("what did Caroline research?")
    assert emb.embed_query("what did Caroline research?") is first
    assert len(endpoint.requests) == 1


def test_endpoint_urls_and_retry_after() -> None:
    assert endpoint_url("http://h:11434/v1") == "http://h:11434/v1/embeddings"
    assert endpoint_url("http://h:8080/") == "http://h:8080/v1/embeddings"
    assert endpoint_url("https://x/openai/v1/embeddings") == "https://x/openai/v1/embeddings"
    assert retry_after_secs("3") == 3.0 and retry_after_secs("soon") is None
    assert retry_after_secs("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0


# --- the factory and the settings -------------------------------------------------------


def test_make_embedder_kinds(endpoint: Endpoint) -> None:
    assert make_embedder("none") is None
    local = make_embedder("local")
    assert isinstance(local, ChildEmbedder) and not local.loaded
    remote_ = make_embedder("openai", endpoint.url, "m", None, batch_size=4)
    assert isinstance(remote_, OpenAIEmbedder) and remote_.batch_size == 4
    for bad in (
        ("openai", None, "m"),
        ("openai", "http://h", None),
        ("local", "http://h", None),
        ("tf",),
    ):
        with pytest.raises(ValueError):
            make_embedder(*bad)  # type: ignore[arg-type]


def test_embedder_settings() -> None:
    assert load_settings({}).embedder == "local"
    s = load_settings(
        {
            "MEMSPINE_EMBEDDER": "OpenAI",
            "MEMSPINE_EMBEDDER_URL": "http://127.0.0.1:11434/v1",
            "MEMSPINE_EMBEDDER_MODEL": "nomic-embed-text",
            "MEMSPINE_EMBEDDER_API_KEY": "",
        }
    )
    assert (s.embedder, s.embedder_url, s.embedder_model, s.embedder_api_key) == (
        "openai",
        "http://127.0.0.1:11434/v1",
        "nomic-embed-text",
        None,
    )
    assert load_settings({"MEMSPINE_EMBEDDER": "none"}).embedder == "none"
    bad = [
        ({"MEMSPINE_EMBEDDER": "torch"}, "expected local, openai or none"),
        ({"MEMSPINE_EMBEDDER": "openai"}, "needs MEMSPINE_EMBEDDER_URL"),
        ({"MEMSPINE_EMBEDDER_URL": "http://h/v1"}, "MEMSPINE_EMBEDDER is 'local'"),
        ({"MEMSPINE_EMBEDDER_URL": "ftp://h/v1"}, "http:// or https://"),
        ({"MEMSPINE_EMBEDDER_URL": "http://u:pw@h:99999/v1"}, "http:// or https://"),
    ]
    for env, message in bad:
        with pytest.raises(SettingsError, match=message) as err:
            load_settings(env)
        assert "pw" not in str(err.value)
