"""The container image as a user runs it (make test-image, run by .ci/run): built from the
Containerfile on the local Debian base, started as its non-root user on a volume, healthy,
an append and a recall by text with the embedder inside the image, the data across a restart,
memspine-admin inside it issuing a key. Its size and cold start go to bench/out/image.json."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import REPO, free_port

# Each start of the container loads the model; a busy machine may take minutes for all of it.
pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]

PODMAN = str(REPO / "scripts" / "podman")
VERSION = next(
    line.split('"')[1]
    for line in (REPO / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)
IMAGE = f"memspine:{VERSION}"
TS = 1_791_208_939_000_000


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run scripts/podman (the machine's options) and return what it printed."""
    done = subprocess.run(
        [PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr[-2000:]}")
    return done


@pytest.fixture(scope="module")
def built() -> dict[str, float]:
    """The image make test-image built first (scripts/build-image), and its size."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (make test-image installs it as root)")
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    return {"size_bytes": float(size)}


class Container:
    """One named container of the image on a fresh volume, on a loopback port."""

    def __init__(self, env: dict[str, str]) -> None:
        self.name = f"memspine-test-{uuid.uuid4().hex[:8]}"
        self.volume = f"{self.name}-data"
        self.port = free_port()
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Create and start it (or start it again); seconds until /health answers 200."""
        began = time.monotonic()
        if podman("container", "exists", self.name, check=False).returncode == 0:
            podman("start", self.name)
        else:
            env = [arg for key, value in self.env.items() for arg in ("-e", f"{key}={value}")]
            podman(
                "run", "-d", "--name", self.name, "-p", f"127.0.0.1:{self.port}:7781",
                "-v", f"{self.volume}:/data", *env, IMAGE,
            )  # fmt: skip
        deadline = began + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - began
            except httpx.TransportError:
                pass
            if (
                podman("inspect", "--format", "{{.State.Running}}", self.name).stdout.strip()
                != "true"
            ):
                break
            time.sleep(0.2)
        logs = podman("logs", self.name, check=False)
        raise AssertionError(
            f"no /health from {self.name}:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}"
        )

    def stop(self) -> None:
        """Stop it (SIGTERM, then the grace period)."""
        podman("stop", "--time", "20", self.name)

    def admin(self, *args: str) -> str:
        """memspine-admin in a container of the image on the same volume, the server stopped."""
        done = podman(
            "run", "--rm", "--network", "none", "-v", f"{self.volume}:/data",
            "--entrypoint", "memspine-admin", IMAGE, "--json", *args,
        )  # fmt: skip
        return done.stdout

    def remove(self) -> None:
        """The container and its volume gone."""
        podman("rm", "-f", "--time", "5", self.name, check=False)
        podman("volume", "rm", "-f", self.volume, check=False)


@pytest.fixture
def container(built: dict[str, float]) -> Iterator[Container]:
    """A container with the local embedder (the image's default)."""
    box = Container({})
    yield box
    box.remove()


def test_the_image_serves_remembers_and_issues_keys(
    built: dict[str, float], container: Container
) -> None:
    cold = container.start()
    # The server runs as the image's non-root user, not root.
    status = podman("exec", container.name, "cat", "/proc/1/status").stdout
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert uid == "10001"
    # The HEALTHCHECK the image declares passes (podman runs it on demand here).
    assert podman("healthcheck", "run", container.name, check=False).returncode == 0
    # An append and a recall by text: the local embedder inside the image makes both vectors.
    auth = {"Authorization": "Bearer image-tenant"}
    texts = ["the parcel was signed for at number 16", "the invoice is due on Friday"]
    ids = []
    for n, text in enumerate(texts):
        answer = httpx.post(
            f"{container.url}/v1/memory/event",
            json={"kind": "turn", "ts": TS + n, "text": text},
            headers=auth,
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["event_id"])
    recall = httpx.post(
        f"{container.url}/v1/memory/recall",
        json={"text": "who received the package?", "k": 1, "wait_for_vectors": True},
        headers=auth,
        timeout=120,
    )
    assert recall.status_code == 200, recall.text
    assert [hit["event_id"] for hit in recall.json()["hits"]] == [ids[0]]
    status = podman("exec", container.name, "cat", "/proc/1/status").stdout
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    inside = {"rss_kib": float(fields["VmRSS"].split()[0]), "threads": float(fields["Threads"])}
    # The data survives a restart of the container on its volume.
    container.stop()
    warm = container.start()
    again = httpx.get(f"{container.url}/v1/memory/event/{ids[1]}", headers=auth, timeout=10)
    assert again.status_code == 200 and again.json()["text"] == texts[1]
    # memspine-admin inside the image issues a key, which the restarted server accepts.
    container.stop()
    container.admin("init")
    tenant = json.loads(container.admin("tenant", "create", "image-test"))["tenant_id"]
    key = json.loads(container.admin("key", "create", tenant, "ci", "--scopes", "read,write"))
    container.start()
    who = httpx.get(
        f"{container.url}/v1/whoami",
        headers={"Authorization": f"Bearer {key['api_key']}"},
        timeout=10,
    )
    assert who.status_code == 200 and who.json()["tenant_id"] == tenant
    refused = httpx.get(f"{container.url}/v1/whoami", headers=auth, timeout=10)
    assert refused.status_code == 401
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    figures = {**built, **inside, "cold_start_to_health_s": cold, "restart_to_health_s": warm}
    (out / "image.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"image figures: {figures}")


def test_the_embedder_needs_no_network(built: dict[str, float]) -> None:
    """The model is inside the image: it embeds with no network at all."""
    probe = (
        "from storage.embedders.local import LocalEmbedder; "
        "print(len(LocalEmbedder().embed(['hello there'])[0]))"
    )
    done = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "python", IMAGE, "-c", probe,
        timeout=300,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "384"
