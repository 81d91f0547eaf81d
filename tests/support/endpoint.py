"""An OpenAI-compatible embeddings endpoint on a loopback port, for tests of the openai embedder
and of the server's background embedder (tests/server, tests/e2e)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def fake_vector(text: str, dim: int) -> list[float]:
    """A deterministic, unnormalised vector for `text`."""
    digest = hashlib.sha256(text.encode()).digest()
    return [float(b) - 100.0 for b in digest[:dim]]


class Endpoint:
    """A real HTTP server answering POST /v1/embeddings; each request takes the next scripted
    reply (status, headers, delay, dimension, shuffled order), then answers normally. A
    request waits while `gate` is cleared (an embedder busy with a batch, held by the test)."""

    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.dim = 8
        self.gate = threading.Event()  # cleared: requests wait here until it is set again
        self.gate.set()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(
                    {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
                )
                endpoint.gate.wait()
                step = endpoint.script.pop(0) if endpoint.script else {}
                time.sleep(step.get("delay", 0))
                status = step.get("status", 200)
                if status != 200:
                    payload = json.dumps({"error": {"message": "scripted failure"}}).encode()
                else:
                    dim = step.get("dim", endpoint.dim)
                    data = [
                        {"object": "embedding", "embedding": fake_vector(t, dim), "index": i}
                        for i, t in enumerate(body["input"])
                    ]
                    if step.get("reverse"):
                        data.reverse()
                    if step.get("drop"):
                        data = data[1:]
                    payload = json.dumps(
                        {
                            "object": "list",
                            "data": data,
                            "model": body["model"],
                            "usage": {"prompt_tokens": 1, "total_tokens": 1},
                        }
                    ).encode()
                try:
                    self.send_response(status)
                    for k, v in step.get("headers", {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()
