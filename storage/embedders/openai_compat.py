"""The openai embedder: any endpoint that answers POST /v1/embeddings as the OpenAI API does."""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec
import numpy as np

from storage.embedders.base import QUERY_CACHE_SIZE, EmbedderError, QueryCache, normalise

log = logging.getLogger("memspine.embedder")

# Statuses worth asking again: the endpoint is overloaded or briefly down.
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class _Item(msgspec.Struct):
    embedding: list[float]
    index: int


class _Answer(msgspec.Struct):
    data: list[_Item]


_decode = msgspec.json.Decoder(_Answer).decode


def endpoint_url(url: str) -> str:
    """The embeddings URL for a base URL: `…/v1` and bare hosts get `/embeddings` or `/v1/embeddings`."""
    base = url.rstrip("/")
    if base.endswith("/embeddings"):
        return base
    if base.endswith("/v1"):
        return base + "/embeddings"
    return base + "/v1/embeddings"


def _safe(url: str) -> str:
    """The URL without credentials or query, for log lines."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def retry_after_secs(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _Failure(Exception):
    """One failed request: a bounded reason, a sentence for the log, maybe a wait."""

    def __init__(
        self, reason: str, message: str, *, retry: bool, wait: float | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry
        self.wait = wait


class OpenAIEmbedder:
    """Vectors from an OpenAI-compatible endpoint: batched, bounded in time, retried with back-off.

    The dimension is learned from the first answer (or given) and every later answer is
    checked against it: a vector of another length is an error, never returned.
    `on_failure(reason)` is called for every failed request, retried or not; reasons are
    timeout, connect, http_429, http_5xx, http_4xx, bad_answer and dimension.
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        *,
        dim: int | None = None,
        batch_size: int = 32,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_wait: float = 30.0,
        on_failure: Callable[[str], None] | None = None,
        query_cache: int = QUERY_CACHE_SIZE,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not model:
            raise ValueError("the openai embedder needs a model name")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.url = endpoint_url(url)
        self.model = model
        self.batch_size = batch_size
        self.retries = retries
        self.backoff = backoff
        self.max_wait = max_wait
        self.on_failure = on_failure
        self.queries = QueryCache(query_cache)
        self.requests = 0  # requests sent, for tests and metrics
        self.failures: Counter[str] = Counter()  # failed requests by reason
        self._dim = dim
        self._dim_lock = threading.Lock()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
            follow_redirects=False,
        )

    @property
    def name(self) -> str:
        """The model name recorded in a tenant: the endpoint's model, as configured."""
        return self.model

    @property
    def dim(self) -> int | None:
        """The vector length, once the first answer (or the caller) has said it."""
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of `texts` in order, `batch_size` texts per request."""
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        parts = [
            self._embed_batch(list(texts[i : i + self.batch_size]))
            for i in range(0, len(texts), self.batch_size)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def embed_query(self, text: str) -> np.ndarray:
        """One text's vector, cached by text."""
        return self.queries.get(text, lambda t: self.embed([t])[0])

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        """One batch, asked up to 1 + retries times."""
        attempt = 0
        while True:
            try:
                return self._request(texts)
            except _Failure as failure:
                self._count(failure.reason)
                wait = self._wait(failure, attempt)
                if wait is None:
                    log.error(
                        "embedder request failed, giving up: %s",
                        failure,
                        extra={
                            "url": _safe(self.url),
                            "model": self.model,
                            "reason": failure.reason,
                            "attempts": attempt + 1,
                        },
                    )
                    raise EmbedderError(
                        failure.reason,
                        f"the embedding service failed ({failure.reason})",
                        retry_after=failure.wait,
                    ) from None
                log.warning(
                    "embedder request failed, retrying in %.1f s: %s",
                    wait,
                    failure,
                    extra={
                        "url": _safe(self.url),
                        "model": self.model,
                        "reason": failure.reason,
                        "attempt": attempt + 1,
                    },
                )
                time.sleep(wait)
                attempt += 1

    def _count(self, reason: str) -> None:
        """Count a failed request and tell the hook; a hook that raises changes nothing."""
        self.failures[reason] += 1
        if self.on_failure is None:
            return
        try:
            self.on_failure(reason)
        except Exception:
            log.exception("embedder on_failure hook raised")

    def _wait(self, failure: _Failure, attempt: int) -> float | None:
        """How long to sleep before the next attempt, or None to give up now."""
        if not failure.retry or attempt >= self.retries:
            return None
        if failure.wait is not None:
            # The endpoint said when: never sooner; past max_wait the caller is told instead.
            return failure.wait if failure.wait <= self.max_wait else None
        delay = min(self.max_wait, self.backoff * 2**attempt)
        return float(
            delay * random.uniform(0.5, 1.0)
        )  # jitter: clients that failed together spread out

    def _request(self, texts: list[str]) -> np.ndarray:
        """One POST; raises _Failure with what went wrong."""
        self.requests += 1
        try:
            resp = self._client.post(self.url, json={"model": self.model, "input": texts})
        except httpx.TimeoutException as exc:
            raise _Failure(
                "timeout", f"no answer in time ({type(exc).__name__})", retry=True
            ) from None
        except httpx.HTTPError as exc:
            raise _Failure(
                "connect", f"request failed ({type(exc).__name__})", retry=True
            ) from None
        status = resp.status_code
        if status != 200:
            wait = (
                retry_after_secs(resp.headers.get("retry-after")) if status in (429, 503) else None
            )
            reason = "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
            raise _Failure(reason, f"HTTP {status}", retry=status in RETRY_STATUSES, wait=wait)
        try:
            answer = _decode(resp.content)
        except msgspec.DecodeError as exc:
            raise _Failure("bad_answer", f"unexpected answer ({exc})", retry=False) from None
        return self._vectors(answer, len(texts))

    def _vectors(self, answer: _Answer, n: int) -> np.ndarray:
        """The answer's vectors in input order, checked for count, index and dimension."""
        items = sorted(answer.data, key=lambda item: item.index)
        if [item.index for item in items] != list(range(n)):
            raise _Failure("bad_answer", f"expected {n} vectors indexed 0..{n - 1}", retry=False)
        lengths = {len(item.embedding) for item in items}
        if len(lengths) != 1 or 0 in lengths:
            raise _Failure("bad_answer", "vectors of different or zero lengths", retry=False)
        (dim,) = lengths
        with self._dim_lock:
            if self._dim is None:
                self._dim = dim
                log.info("embedder dimension learned", extra={"model": self.model, "dim": dim})
            elif dim != self._dim:
                raise _Failure(
                    "dimension", f"vectors of length {dim}, expected {self._dim}", retry=False
                )
        vectors = np.array([item.embedding for item in items], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1)
        if not np.all(np.isfinite(norms) & (norms > 0)):
            raise _Failure("bad_answer", "a zero or non-finite vector", retry=False)
        return normalise(vectors)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
