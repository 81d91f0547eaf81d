"""An ONNX graph of a BERT encoder with mean pooling, built from its safetensors weights.

No exporter and no torch: the graph is written node by node with onnxruntime's fused BERT
operators (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu), and the
three dense layers of each block optionally as MatMulNBits with 8-bit weights in blocks of
32 and int8 activations per block (accuracy_level 4), which keeps the vectors within
rounding of the float model while the integer kernels do the arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

MS = "com.microsoft"
INT8_BLOCK = 32


@dataclass(frozen=True)
class BertShape:
    """The sizes the graph is built for (all-MiniLM-L6-v2's by default)."""

    layers: int = 6
    hidden: int = 384
    heads: int = 12
    eps: float = 1e-12


class _Graph:
    """Nodes and initializers under construction."""

    def __init__(self) -> None:
        import onnx.helper as helper
        import onnx.numpy_helper as numpy_helper

        self.helper = helper
        self.numpy_helper = numpy_helper
        self.nodes: list[object] = []
        self.inits: list[object] = []

    def const(self, name: str, value: np.ndarray) -> str:
        """Add a constant tensor; returns its name."""
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(
        self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: Any
    ) -> str:
        """Add a node; returns the name of its first output."""
        self.nodes.append(self.helper.make_node(op, inputs, outputs, domain=domain, **attrs))
        return outputs[0]


def _dense(
    g: _Graph, x: str, w: np.ndarray, b: np.ndarray, name: str, int8: bool
) -> tuple[str, str]:
    """X @ w, returned with the name of the bias still to add (w is out × in, as torch stores it)."""
    weight = np.asarray(w, dtype=np.float32)
    bias = g.const(f"{name}.b", np.asarray(b, dtype=np.float32))
    if not int8:
        out = g.node("MatMul", [x, g.const(f"{name}.w", weight.T)], [f"{name}.mm"])
        return out, bias
    n, k = weight.shape
    blocks = weight.reshape(n, k // INT8_BLOCK, INT8_BLOCK)
    scale = np.abs(blocks).max(axis=-1) / 127.0
    scale[scale == 0] = 1.0
    # Unsigned storage around the default zero point of 128: no zero-point tensor needed.
    q = np.clip(np.rint(blocks / scale[..., None]), -127, 127) + 128
    out = g.node(
        "MatMulNBits",
        [
            x,
            g.const(f"{name}.q", q.astype(np.uint8)),
            g.const(f"{name}.s", scale.reshape(-1).astype(np.float32)),
        ],
        [f"{name}.mm"],
        domain=MS,
        K=k,
        N=n,
        bits=8,
        block_size=INT8_BLOCK,
        accuracy_level=4,
    )
    return out, bias


def build_bert(weights: Mapping[str, np.ndarray], shape: BertShape, *, int8: bool) -> bytes:
    """The serialized ONNX model: (input_ids, attention_mask) int32 (B, S) -> masked sum (B, H)."""
    import onnx
    from onnx import TensorProto

    g = _Graph()
    emb = "embeddings."
    # Every token has type 0, so its embedding is folded into the position table.
    position = (
        weights[emb + "position_embeddings.weight"]
        + weights[emb + "token_type_embeddings.weight"][0]
    )
    x = g.node(
        "EmbedLayerNormalization",
        [
            "input_ids",
            "",
            g.const("word", weights[emb + "word_embeddings.weight"]),
            g.const("position", position.astype(np.float32)),
            "",
            g.const("emb.gamma", weights[emb + "LayerNorm.weight"]),
            g.const("emb.beta", weights[emb + "LayerNorm.bias"]),
            "attention_mask",
        ],
        ["x.emb", "mask_index"],
        domain=MS,
        epsilon=shape.eps,
    )
    for i in range(shape.layers):
        x = _block(g, weights, f"encoder.layer.{i}.", f"l{i}", x, shape, int8)
    g.node("Cast", ["attention_mask"], ["mask.f"], to=TensorProto.FLOAT)
    g.node("Unsqueeze", ["mask.f", g.const("axis.last", np.array([-1], np.int64))], ["mask.f3"])
    g.node("Mul", [x, "mask.f3"], ["masked"])
    # A sum, not a mean: the vector is L2-normalised afterwards, which divides the count out.
    g.node(
        "ReduceSum",
        ["masked", g.const("axis.seq", np.array([1], np.int64))],
        ["pooled"],
        keepdims=0,
    )

    h = onnx.helper
    graph = h.make_graph(
        g.nodes,  # type: ignore[arg-type]
        "bert_mean_pool",
        [
            h.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"]),
            h.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "seq"]),
        ],
        [h.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", shape.hidden])],
        g.inits,  # type: ignore[arg-type]
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _block(
    g: _Graph, w: Mapping[str, np.ndarray], p: str, n: str, x: str, shape: BertShape, int8: bool
) -> str:
    """One encoder layer: self-attention, then the feed-forward, each with its residual norm."""
    att = p + "attention."
    # The QKV projection stays in float: quantising it costs more accuracy than the others.
    qkv_w = np.concatenate(
        [w[att + f"self.{k}.weight"].T for k in ("query", "key", "value")], axis=1
    ).astype(np.float32)
    qkv_b = np.concatenate([w[att + f"self.{k}.bias"] for k in ("query", "key", "value")])
    a = g.node(
        "Attention",
        [
            x,
            g.const(f"{n}.qkv.w", qkv_w),
            g.const(f"{n}.qkv.b", qkv_b.astype(np.float32)),
            "mask_index",
        ],
        [f"{n}.att"],
        domain=MS,
        num_heads=shape.heads,
    )
    o, ob = _dense(
        g, a, w[att + "output.dense.weight"], w[att + "output.dense.bias"], f"{n}.o", int8
    )
    x1 = _add_norm(g, o, ob, x, w, att + "output.LayerNorm", f"{n}.x1", shape)
    f1, f1b = _dense(
        g,
        x1,
        w[p + "intermediate.dense.weight"],
        w[p + "intermediate.dense.bias"],
        f"{n}.ff1",
        int8,
    )
    act = g.node("BiasGelu", [f1, f1b], [f"{n}.gelu"], domain=MS)
    f2, f2b = _dense(
        g, act, w[p + "output.dense.weight"], w[p + "output.dense.bias"], f"{n}.ff2", int8
    )
    return _add_norm(g, f2, f2b, x1, w, p + "output.LayerNorm", f"{n}.x2", shape)


def _add_norm(
    g: _Graph,
    y: str,
    bias: str,
    residual: str,
    w: Mapping[str, np.ndarray],
    ln: str,
    out: str,
    shape: BertShape,
) -> str:
    """LayerNorm(y + bias + residual), as two Adds and the standard LayerNormalization.

    Not SkipLayerNormalization: onnxruntime's CPU kernel of it took ten times as long as
    LayerNormalization on the same rows (bench/RESULTS.md, "Local embedder"); the session
    disables the fusion that would rebuild it (storage/embedders/local.py).
    """
    s = g.node("Add", [y, bias], [f"{out}.biased"])
    s = g.node("Add", [s, residual], [f"{out}.sum"])
    return g.node(
        "LayerNormalization",
        [s, g.const(f"{out}.g", w[ln + ".weight"]), g.const(f"{out}.b", w[ln + ".bias"])],
        [out],
        axis=-1,
        epsilon=shape.eps,
    )
