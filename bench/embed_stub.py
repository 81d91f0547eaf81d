"""A trivial OpenAI-compatible /v1/embeddings endpoint for bench/embed_server.py: 384-d unit
vectors drawn from each text's CRC32 (near zero CPU), so MEMSPINE_EMBEDDER=openai measures what
server embedding costs the server with the model elsewhere.

    python bench/embed_stub.py    # prints its loopback port, then serves until killed
"""

from __future__ import annotations

import json
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

DIM = 384


class Handler(BaseHTTPRequestHandler):
    """Answers POST /v1/embeddings the way the OpenAI API documents it."""

    def do_POST(self) -> None:
        """One embeddings request: a vector per input, in order."""
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = []
        for i, text in enumerate(body["input"]):
            v = np.random.default_rng(zlib.crc32(text.encode())).standard_normal(DIM)
            data.append(
                {"object": "embedding", "index": i, "embedding": (v / np.linalg.norm(v)).tolist()}
            )
        usage = {"prompt_tokens": len(data), "total_tokens": len(data)}
        out = json.dumps({"object": "list", "data": data, "model": body["model"], "usage": usage})
        raw = out.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        """Quiet: the bench reads only the port line."""


def main() -> None:
    """Serve on a free loopback port, printed first."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
