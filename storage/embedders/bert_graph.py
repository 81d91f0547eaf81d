"""An ONNX graph of a BERT encoder with mean pooling, built from its safetensors weights.

No exporter and no torch: the graph is written node by node with onnxruntime's operators
(EmbedLayerNormalization, MultiHeadAttention, BiasGelu, the standard LayerNormalization).
Every row of a batch has the same length: there is no padding and no attention mask, which
lets onnxruntime's MultiHeadAttention take its fused kernel (a mask sends it to one that took
twice as long; bench/RESULTS.md, "Local embedder"). The hidden states are 2-D (tokens ×
channels) between the attention nodes, so a scale per token is a scale per row.

In int8 the QKV projection, the attention output and the first feed-forward layer multiply
int8 activations (a scale per token) by int8 weights (a scale per output column); the few
outlier channels of their inputs stay in float32 beside the int8 product. The second
feed-forward layer stays in float32, which keeps the vectors within 0.999 of the float model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

MS = "com.microsoft"
# Channels of the hidden state after each LayerNorm whose values run to 10-30 where the others
# stay near 2 (all-MiniLM-L6-v2; the union of each layer's eight largest, measured on 80 LoCoMo
# turns): the QKV projection and the first feed-forward layer take them in float.
OUTLIERS = (63, 99, 127, 131, 157, 223, 246, 267, 303, 319, 338, 347, 354, 363)
# The name of the per-row zero points (128 for every token of the batch) the int8 layers share.
ROW_ZERO_POINTS = "rows.zp"


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


def row_zero_points(g: _Graph, x: str) -> str:
    """The uint8 zero point 128 once per row of the 2-D `x`, as per-row quantisation takes it."""
    rows = g.node("Shape", [x], ["rows.count"], end=1)
    return g.node("Expand", [g.const("zp.128", np.array(128, np.uint8)), rows], [ROW_ZERO_POINTS])


def _dense(
    g: _Graph,
    x: str,
    w: np.ndarray,
    b: np.ndarray,
    name: str,
    int8: bool,
    outliers: tuple[int, ...] = (),
) -> tuple[str, str]:
    """X @ w.T for a 2-D X, returned with the name of the bias still to add (w is out × in).

    In int8, each row of x (a token) is scaled to int8 by its own largest value and
    multiplied by 7-bit weights with a scale per output column (QuantizeLinear per row, then
    MatMulIntegerToFloat: two fused kernels); the input channels in `outliers`, whose values
    run ten times the others', would spoil that per-token scale, so they are masked out of it
    and multiplied in float32 beside it. Needs `row_zero_points` in the graph.
    """
    weight = np.asarray(w, dtype=np.float32).T  # in × out
    bias = g.const(f"{name}.b", np.asarray(b, dtype=np.float32))
    if not int8:
        return g.node("MatMul", [x, g.const(f"{name}.w", weight)], [f"{name}.mm"]), bias
    idx = np.array(sorted(outliers), dtype=np.int64)
    quantised = weight.copy()
    quantised[idx] = 0.0
    # 7-bit weights: an x86 core without VNNI adds u8 × s8 pairs in 16 bits, which 8-bit
    # weights saturate (docs/embeddings.md, "Precision").
    col_scale = np.abs(quantised).max(axis=0) / 63.0
    col_scale[col_scale == 0] = 1.0
    q = np.clip(np.rint(quantised / col_scale), -63, 63).astype(np.int8)
    xq = x
    if len(idx):
        mask = np.ones(weight.shape[0], dtype=np.float32)
        mask[idx] = 0.0
        xq = g.node("Mul", [x, g.const(f"{name}.mask", mask)], [f"{name}.xq"])
    amax = g.node(
        "ReduceMax",
        [g.node("Abs", [xq], [f"{name}.abs"])],
        [f"{name}.amax"],
        axes=[-1],
        keepdims=1,
    )
    scale = g.node(
        "Max",
        [
            g.node(
                "Mul",
                [amax, g.const(f"{name}.1/127", np.array(1.0 / 127.0, np.float32))],
                [f"{name}.scale0"],
            ),
            g.const(f"{name}.tiny", np.array(1e-10, np.float32)),
        ],
        [f"{name}.scale"],
    )
    rows = g.node(
        "Reshape", [scale, g.const(f"{name}.flat", np.array([-1], np.int64))], [f"{name}.rs"]
    )
    # Unsigned around a zero point of 128: the u8 × s8 kernels are onnxruntime's fast path.
    u8 = g.node("QuantizeLinear", [xq, rows, ROW_ZERO_POINTS], [f"{name}.u8"], axis=0)
    y = g.node(
        "MatMulIntegerToFloat",
        [
            u8,
            g.const(f"{name}.q", q),
            g.const(f"{name}.one", np.array(1.0, np.float32)),
            g.const(f"{name}.s", col_scale.astype(np.float32)),
            g.const(f"{name}.zp", np.array(128, np.uint8)),
        ],
        [f"{name}.mmi"],
        domain=MS,
    )
    y = g.node("Mul", [y, scale], [f"{name}.mmq"])
    if not len(idx):
        return y, bias
    xo = g.node("Gather", [x, g.const(f"{name}.idx", idx)], [f"{name}.xo"], axis=1)
    yo = g.node("MatMul", [xo, g.const(f"{name}.wo", weight[idx])], [f"{name}.yo"])
    return g.node("Add", [y, yo], [f"{name}.mm"]), bias


def build_bert(weights: Mapping[str, np.ndarray], shape: BertShape, *, int8: bool) -> bytes:
    """The serialized ONNX model: input_ids int32 (B, S), no padding -> sum over tokens (B, H)."""
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
        ],
        ["x.emb", "mask_index"],  # the mask index goes unused: there is no padding
        domain=MS,
        epsilon=shape.eps,
    )
    g.node(
        "Concat",
        [
            g.node("Shape", ["input_ids"], ["ids.shape"]),
            g.const("hidden", np.array([shape.hidden], np.int64)),
        ],
        ["shape.3d"],
        axis=0,
    )
    g.const("shape.2d", np.array([-1, shape.hidden], np.int64))
    x = g.node("Reshape", [x, "shape.2d"], ["x.0"])
    row_zero_points(g, x)
    for i in range(shape.layers):
        x = _block(g, weights, f"encoder.layer.{i}.", f"l{i}", x, shape, int8)
    # A sum, not a mean: the vector is L2-normalised afterwards, which divides the count out.
    g.node(
        "ReduceSum",
        [
            g.node("Reshape", [x, "shape.3d"], ["x.3d"]),
            g.const("axis.seq", np.array([1], np.int64)),
        ],
        ["pooled"],
        keepdims=0,
    )

    h = onnx.helper
    graph = h.make_graph(
        g.nodes,  # type: ignore[arg-type]
        "bert_mean_pool",
        [h.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"])],
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
    h = shape.hidden
    qkv_w = np.concatenate([w[att + f"self.{k}.weight"] for k in ("query", "key", "value")])
    qkv, q_b = _dense(g, x, qkv_w, w[att + "self.query.bias"], f"{n}.qkv", int8, OUTLIERS)
    q, k, v = f"{n}.q", f"{n}.k", f"{n}.v"
    g.node("Split", [qkv, g.const(f"{n}.split", np.array([h, h, h], np.int64))], [q, k, v], axis=1)
    # Only the query's bias is added here: the key's adds the same to every score of a query
    # (softmax ignores it), and the value's passes through the attention unchanged (its
    # weights sum to one), so it is folded into the output layer's bias below.
    q = g.node("Add", [q, q_b], [f"{n}.qb"])
    a = g.node(
        "MultiHeadAttention",
        [g.node("Reshape", [t, "shape.3d"], [f"{t}.3d"]) for t in (q, k, v)],
        [f"{n}.att"],
        domain=MS,
        num_heads=shape.heads,
    )
    a = g.node("Reshape", [a, "shape.2d"], [f"{n}.att.2d"])
    o_w = w[att + "output.dense.weight"]
    o_b = w[att + "output.dense.bias"] + o_w @ w[att + "self.value.bias"]
    o, ob = _dense(g, a, o_w, o_b, f"{n}.o", int8)
    x1 = _add_norm(g, o, ob, x, w, att + "output.LayerNorm", f"{n}.x1", shape)
    f1, f1b = _dense(
        g,
        x1,
        w[p + "intermediate.dense.weight"],
        w[p + "intermediate.dense.bias"],
        f"{n}.ff1",
        int8,
        OUTLIERS,
    )
    act = g.node("BiasGelu", [f1, f1b], [f"{n}.gelu"], domain=MS)
    # The second feed-forward layer stays in float: its input (after GELU) has outliers that
    # move from layer to layer and token to token, and its weights a few rows far above the
    # rest; int8 there cost more accuracy than the other three layers together.
    f2, f2b = _dense(
        g, act, w[p + "output.dense.weight"], w[p + "output.dense.bias"], f"{n}.ff2", False
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
