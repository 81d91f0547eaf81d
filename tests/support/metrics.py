"""Values out of a Prometheus exposition (GET /metrics)."""

from __future__ import annotations


def value(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition, by name and labels."""
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[1])
    raise AssertionError(f"{want} not exposed")


def metric(text: str, name: str) -> float:
    """The value of an unlabelled series in a Prometheus exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")
