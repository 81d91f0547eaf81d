"""Prometheus metrics: one registry per app, served at GET /metrics without auth.

Tenant ids appear only with MEMSPINE_METRICS_PER_TENANT=1; event text never does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from memspine.logs import RequestRecord
from storage.tenants.embedding import EmbeddingWorker
from storage.tenants.footprint import PARTS, tenant_memory
from storage.tenants.manager import REASONS, TenantManager
from storage.tenants.tenant import Tenant

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
OPEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PURGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Litestar appends the charset to text types itself; given twice, some scrapers reject the header.
MEDIA_TYPE = CONTENT_TYPE_LATEST.split("; charset")[0]


class Metrics:
    """The app's registry and the few calls that feed it."""

    def __init__(self, *, per_tenant: bool = False) -> None:
        self.per_tenant = per_tenant
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "memspine_requests",
            "HTTP requests by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "memspine_request_duration_seconds",
            "Time from request to the last byte of the answer, by route template, method and status.",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_sizes = Histogram(
            "memspine_group_commit_batch_size",
            "Jobs committed together by a tenant's writer in one durable transaction.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.open_seconds = Histogram(
            "memspine_tenant_open_seconds",
            "Time to open a tenant (first use or reopen after eviction), closing any victim excluded.",
            buckets=OPEN_BUCKETS,
            registry=r,
        )
        self.purge_seconds = Histogram(
            "memspine_purge_duration_seconds",
            "Time to purge one tenant (rewrite its files so deleted bytes leave the disk).",
            buckets=PURGE_BUCKETS,
            registry=r,
        )
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.tenant_requests: Counter | None = None
        if per_tenant:
            self.tenant_requests = Counter(
                "memspine_tenant_requests",
                "Authenticated requests by tenant and status (MEMSPINE_METRICS_PER_TENANT=1).",
                ["tenant", "status"],
                registry=r,
            )

    def watch(self, manager: TenantManager) -> None:
        """Export the manager's gauges and counters and observe every tenant it opens."""
        manager.on_open = self._on_open
        self.registry.register(_ManagerCollector(manager, per_tenant=self.per_tenant))

    def watch_embedding(self, worker: EmbeddingWorker | None) -> None:
        """Export the background embedder's backlog, its vectors written and its failures
        (zero and empty without an embedder)."""
        self.registry.register(_EmbeddingCollector(worker))

    def watch_limits(self, rejected: Callable[[], dict[str, int]]) -> None:
        """Export the requests refused by a key's or tenant's limit, by the limit."""
        self.registry.register(_RejectedCollector(rejected))

    def _on_open(self, tenant: Tenant, seconds: float) -> None:
        """A tenant opened: time it and measure its writer's batches from now on."""
        self.open_seconds.observe(seconds)
        tenant.on_batch = self.batch_sizes.observe

    def observe_request(self, record: RequestRecord) -> None:
        """Count and time one HTTP request."""
        key = (record.route, record.method, record.status)
        children = self._children.get(key)
        if children is None:
            # labels() locks and builds its key on every call: on the event loop, once per
            # request of every route, so each combination's children are looked up once (route
            # templates, METHODS and statuses: a bounded set).
            status = str(record.status)
            children = (
                self.requests.labels(record.route, record.method, status),
                self.latency.labels(record.route, record.method, status),
            )
            self._children[key] = children
        children[0].inc()
        children[1].observe(record.duration)
        if self.tenant_requests is not None and record.tenant_id is not None:
            self.tenant_requests.labels(record.tenant_id, str(record.status)).inc()

    def observe_purge(self, seconds: float) -> None:
        """Record how long one tenant's purge took (called by the purger)."""
        self.purge_seconds.observe(seconds)

    def render(self) -> bytes:
        """The exposition text (blocking: it reads every open tenant's map size)."""
        return generate_latest(self.registry)


class _EmbeddingCollector(Collector):
    """memspine_embeddings_pending and the embedder's counters, read at scrape time."""

    def __init__(self, worker: EmbeddingWorker | None) -> None:
        self.worker = worker

    def describe(self) -> Iterator[Metric]:
        """Nothing up front (the families are made at scrape time)."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """The backlog, the vectors written and the failed batches by reason."""
        w = self.worker
        yield GaugeMetricFamily(
            "memspine_embeddings_pending",
            "Events of open tenants awaiting the vector the server makes for them.",
            value=0 if w is None else w.pending(),
        )
        yield GaugeMetricFamily(
            "memspine_embeddings_keyword_only_tenants",
            "Tenants whose batches hung the embedder twice: their events are found by keyword "
            "only until the server restarts.",
            value=0 if w is None else len(w.keyword_only),
        )
        yield CounterMetricFamily(
            "memspine_embeddings_written",
            "Server vectors written into events' records.",
            value=0 if w is None else w.embedded,
        )
        failed = CounterMetricFamily(
            "memspine_embedder_failures",
            "Embedder calls that failed (each retried), by reason: timeout, connect, http_429, "
            "http_5xx, http_4xx, bad_answer, dimension, disk_full (a write of vectors the full "
            "disk refused), model_process_died, model_process_hung (killed past its deadline), "
            "or the error's type.",
            labels=["reason"],
        )
        for reason, count in sorted(({} if w is None else w.failures_by).items()):
            failed.add_metric([reason], count)
        yield failed


class _RejectedCollector(Collector):
    """memspine_rejected_total{reason}: requests refused by a limit, read at scrape time."""

    def __init__(self, rejected: Callable[[], dict[str, int]]) -> None:
        self.rejected = rejected

    def describe(self) -> Iterator[Metric]:
        """Nothing up front (the family is made at scrape time)."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """One counter per limit: requests_per_minute (429), max_events, max_bytes and
        max_memory (403)."""
        family = CounterMetricFamily(
            "memspine_rejected",
            "Requests refused by a limit: a key over its requests_per_minute (429), a tenant "
            "at its max_events, max_bytes or max_memory (403).",
            labels=["reason"],
        )
        for reason, count in sorted(self.rejected().items()):
            family.add_metric([reason], count)
        yield family


class _ManagerCollector(Collector):
    """Reads the tenant manager at scrape time, so no count can drift from the manager's own."""

    def __init__(self, manager: TenantManager, *, per_tenant: bool) -> None:
        self.manager = manager
        self.per_tenant = per_tenant

    def describe(self) -> Iterator[Metric]:
        """Nothing up front: the registry need not scrape the manager to learn the names."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """The open-tenant gauges, the lifecycle counters and the LMDB map sizes."""
        m = self.manager
        st = m.stats()
        yield GaugeMetricFamily("memspine_open_tenants", "Tenants open now.", value=st.open)
        yield GaugeMetricFamily(
            "memspine_max_open_tenants", "The cap on open tenants.", value=m.max_open
        )
        counters = (
            ("memspine_tenant_opens", "Tenants opened (first use or reopen).", st.opens),
            (
                "memspine_tenant_evictions",
                "Idle tenants closed to make room (either limit).",
                st.evictions,
            ),
            ("memspine_tenant_idle_closes", "Tenants closed after the idle time.", st.idle_closes),
            (
                "memspine_unavailable",
                "Requests refused with 503: the room was busy.",
                st.rejections,
            ),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        yield from self._memory(st.evictions_by, st.rejections_by)
        yield GaugeMetricFamily(
            "memspine_vectors_pending",
            "Vectors acknowledged (searched exactly) but not yet in an HNSW graph, open tenants.",
            value=sum(t.vectors_pending() for t in m.open_tenants()),
        )
        sizes = m.map_sizes()
        yield GaugeMetricFamily(
            "memspine_lmdb_map_bytes",
            "Sum of the LMDB map sizes of the open tenants.",
            value=sum(sizes.values()),
        )
        if self.per_tenant:
            per = GaugeMetricFamily(
                "memspine_tenant_lmdb_map_bytes",
                "LMDB map size of each open tenant (MEMSPINE_METRICS_PER_TENANT=1).",
                labels=["tenant"],
            )
            for tenant_id, size in sorted(sizes.items()):
                per.add_metric([tenant_id], size)
            yield per

    def _memory(self, evictions: dict[str, int], rejections: dict[str, int]) -> Iterator[Metric]:
        """The memory budget: what open tenants hold (in all and by part), the budget, and
        evictions and refusals by the limit that caused them."""
        m = self.manager
        m.refresh()  # the inserter grows graphs between requests: count them as they are now
        st = m.stats()
        yield GaugeMetricFamily(
            "memspine_open_tenant_bytes",
            "Estimated memory of the open tenants (and those closing), as the budget counts it.",
            value=st.open_bytes,
        )
        yield GaugeMetricFamily(
            "memspine_open_bytes_budget",
            "The memory budget of open tenants (MEMSPINE_MAX_OPEN_BYTES).",
            value=st.budget if st.budget is not None else float("inf"),
        )
        parts = GaugeMetricFamily(
            "memspine_open_tenant_part_bytes",
            "Estimated memory of the open tenants by part: graph, exact, keyword, other.",
            labels=["part"],
        )
        tenants = m.open_tenants()
        by_part = [tenant_memory(t) for t in tenants]
        for part in PARTS:
            parts.add_metric([part], sum(p[part] for p in by_part))
        yield parts
        for name, doc, counts in (
            (
                "memspine_tenant_evictions_by_reason",
                "Idle tenants closed to make room, by limit.",
                evictions,
            ),
            ("memspine_unavailable_by_reason", "Requests refused with 503, by limit.", rejections),
        ):
            family = CounterMetricFamily(name, doc, labels=["reason"])
            for reason in REASONS:
                family.add_metric([reason], counts.get(reason, 0))
            yield family
        if self.per_tenant:
            per = GaugeMetricFamily(
                "memspine_tenant_memory_bytes",
                "Estimated memory of each open tenant (MEMSPINE_METRICS_PER_TENANT=1).",
                labels=["tenant"],
            )
            for tenant, p in sorted(
                zip(tenants, by_part, strict=True), key=lambda tp: tp[0].tenant_id
            ):
                per.add_metric([tenant.tenant_id], sum(p.values()))
            yield per
