"""The policy of a server whose embedder makes its tenants' vectors (docs/embeddings.md,
docs/recall.md): appends held back while the embedder's backlog is full, recall by text given
the embedder's vector of the query and the feedback step, and a recall that first waits until
every event acknowledged before it has its vector. Each wait blocks on the background
embedder's condition (storage/tenants/embedding.py), never polls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import msgspec

from storage.embedders import EmbedderError
from storage.errors import Unavailable
from storage.log import layout
from storage.model import NewEvent
from storage.read.recall import Feedback, RecallQuery, RecallResult
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.tenant import Tenant

log = logging.getLogger("memspine.engine")
# Appends that would list events for the embedder wait at most this long for their tenant's
# room in the backlog (MEMSPINE_EMBEDDINGS_MAX_PENDING, shared fairly between tenants with work:
# storage/tenants/embedding.py), then get 503 (nothing written, nothing lost).
BACKLOG_WAIT_SECS = 30.0
BACKLOG_FULL = (
    "the server's embedder is behind on this tenant's events (its share of "
    "MEMSPINE_EMBEDDINGS_MAX_PENDING awaits vectors); nothing was written: retry shortly"
)
# A recall with wait_for_vectors waits at most this long.
VECTORS_WAIT_SECS = 10.0
VECTORS_LATE = (
    "events of this tenant still await their vectors after {secs:g} s (the embedder is "
    "behind or failing); retry, or recall without wait_for_vectors"
)
# The feedback step every recall with text and a vector gets (docs/recall.md).
FEEDBACK = Feedback(hits=2, weight=0.5)


class ServerVectors:
    """The server-embedding policy over one background embedder (None: the server embeds
    nothing, and every step is a no-op)."""

    def __init__(self, worker: EmbeddingWorker | None) -> None:
        self.worker = worker

    # -- back-pressure ----------------------------------------------------------------------

    def must_wait(self, tenant: Tenant, events: Iterable[NewEvent]) -> bool:
        """Whether appending these events must first wait for room in the embedder's backlog
        (they would list text-only events for it while it is full); cheap, never blocks."""
        w = self.worker
        if w is None or w.has_room(tenant.tenant_id) or tenant.space == layout.SPACE_CLIENT:
            return False
        if tenant.space is None and w.offer() is None:
            return False
        return any(ev.embedding is None and ev.text for ev in events)

    def wait_for_room(self, tenant_id: str | None = None) -> None:
        """Blocking: wait until the backlog has room for the tenant's appends (its fair share
        once it is full); Unavailable (503, nothing written) if it has none for
        BACKLOG_WAIT_SECS."""
        w = self.worker
        if w is not None and not w.wait_for_room(BACKLOG_WAIT_SECS, tenant_id):
            raise Unavailable(BACKLOG_FULL, headers={"Retry-After": "5"})

    # -- recall ----------------------------------------------------------------------------

    def answers_at_once(self, tenant: Tenant, query: RecallQuery) -> bool:
        """Whether recall(tenant, query) runs neither the model nor a wait (cheap: the query
        carries its vector, has no text, is cached, or the tenant's vectors are not ours)."""
        w = self.worker
        if w is None or query.embedding is not None or not w.serves(tenant):
            return True
        return not query.text or w.cached_query(tenant.embedded_question(query)) is not None

    def recall(
        self, tenant: Tenant, query: RecallQuery, *, wait_for_vectors: bool = False
    ) -> RecallResult:
        """Blocking: fused recall over the tenant. In a tenant whose vectors this server makes,
        a query with text and no embedding gets the embedder's vector of the text and both
        arms; wait_for_vectors first waits until every event acknowledged before the recall
        has its vector (VECTORS_WAIT_SECS at most, then 503). Hits carry no embeddings."""
        w = self.worker
        if w is None or query.embedding is not None or not w.serves(tenant):
            # A client's own vector gets the feedback step too (it needs text and a vector,
            # and only reads the tenant's stored vectors, whoever made them: docs/recall.md).
            return tenant.recall(query, embeddings=False, feedback=FEEDBACK)
        if wait_for_vectors and tenant.tenant_id not in w.keyword_only:  # else none will come
            self.wait_for_vectors(tenant)
        feedback: Feedback | None = None
        if query.text:
            # The question less the people it names: they rank through their own arms
            # (docs/recall.md, "Server-embedded recall"); the keyword arm gets the text as asked.
            asked = tenant.embedded_question(query)
            vector = w.cached_query(asked)
            if vector is None:
                try:
                    vector = w.embedder.embed_query(asked)
                except EmbedderError as exc:  # the keyword arm still answers
                    log.warning("query not embedded (%s): keyword recall only", exc.reason)
            if vector is not None:
                query = msgspec.structs.replace(
                    query, embedding=vector.tolist(), embedding_model=w.embedder.name
                )
                feedback = FEEDBACK
        return tenant.recall(query, embeddings=False, feedback=feedback)

    def wait_for_vectors(self, tenant: Tenant) -> None:
        """Blocking: wait until every event appended before now has its server vector
        (VECTORS_WAIT_SECS at most, then Unavailable)."""
        w = self.worker
        if w is None:
            return
        upto = tenant.last_seq()
        w.hurry(tenant.tenant_id)  # no linger for a small backlog (docs/embeddings.md)
        deadline = time.monotonic() + VECTORS_WAIT_SECS
        while True:
            seen = w.written()
            if not tenant.awaiting_vectors(upto):
                return
            if not w.wait_written(seen, deadline - time.monotonic()):
                detail = VECTORS_LATE.format(secs=VECTORS_WAIT_SECS)
                raise Unavailable(detail, headers={"Retry-After": "1"})
