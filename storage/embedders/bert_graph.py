"""An ONNX graph of a BERT encoder with mean pooling, built from its safetensors weights.

No exporter and no torch: the graph is written node by node with onnxruntime's fused BERT
operators (EmbedLayerNormalization, Attention, BiasGelu) and the standard LayerNormalization.
In int8 the attention-output and first feed-forward layers multiply int8 activations (a
scale per token) by int8 weights (a scale per output column), with the first feed-forward
layer's few outlier input channels in float32; the QKV projection and the second
feed-forward layer stay in float32, which keeps the vectors within 0.999 of the float model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

MS = "com.microsoft"
# Channels of the hidden state after each attention block's LayerNorm whose values run to
# 10-30 where the others stay near 2 (all-MiniLM-L6-v2; the union of each layer's eight
# largest, measured on 80 LoCoMo turns): the first feed-forward layer takes them in float.
FF1_OUTLIERS = (63, 99, 127, 131, 157, 223, 246, 267, 303, 319, 338, 347, 354, 363)


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
    g: _Graph,
    x: str,
    w: np.ndarray,
    b: np.ndarray,
    name: str,
    int8: bool,
    outliers: tuple[int, ...] = (),
) -> tuple[str, str]:
    """X @ w, returned with the name of the bias still to add (w is out × in, as torch stores it).

    In int8, each row of X is scaled to int8 by its own largest value (a per-token scale)
    and multiplied by int8 weights with a scale per output column; the input channels in
    `outliers`, whose values run ten times the others', would spoil that per-token scale,
    so they are left out of it and multiplied in float32 beside it.
    """
    from onnx import TensorProto

    weight = np.asarray(w, dtype=np.float32).T  # in × out
    bias = g.const(f"{name}.b", np.asarray(b, dtype=np.float32))
    if not int8:
        return g.node("MatMul", [x, g.const(f"{name}.w", weight)], [f"{name}.mm"]), bias
    idx = np.array(sorted(outliers), dtype=np.int64)
    quantised = weight.copy()
    quantised[idx] = 0.0
    col_scale = np.abs(quantised).max(axis=0) / 127.0
    col_scale[col_scale == 0] = 1.0
    q = np.clip(np.rint(quantised / col_scale), -127, 127).astype(np.int8)
    xq = x
    if len(idx):
        mask = np.ones(weight.shape[0], dtype=np.float32)
        mask[idx] = 0.0
        xq = g.node("Mul", [x, g.const(f"{name}.mask", mask)], [f"{name}.xq"])
    amax = g.node(
        "ReduceMax",
        [g.node("Abs", [xq], [f"{name}.abs"])],
        [f"{name}.amax0"],
        axes=[-1],
        keepdims=1,
    )
    amax = g.node(
        "Max", [amax, g.const(f"{name}.tiny", np.array(1e-8, np.float32))], [f"{name}.amax"]
    )
    inv = g.node(
        "Div", [g.const(f"{name}.127", np.array(127.0, np.float32)), amax], [f"{name}.inv"]
    )
    r = g.node("Round", [g.node("Mul", [xq, inv], [f"{name}.scaled"])], [f"{name}.round"])
    # Unsigned around a zero point of 128: the u8 × s8 kernels are onnxruntime's fast path.
    r = g.node("Add", [r, g.const(f"{name}.128", np.array(128.0, np.float32))], [f"{name}.u"])
    u8 = g.node("Cast", [r], [f"{name}.u8"], to=TensorProto.UINT8)
    y = g.node(
        "MatMulIntegerToFloat",
        [
            u8,
            g.const(f"{name}.q", q),
            g.const(f"{name}.rs", np.array(1.0 / 127.0, np.float32)),
            g.const(f"{name}.s", col_scale.astype(np.float32)),
            g.const(f"{name}.zp", np.array(128, np.uint8)),
        ],
        [f"{name}.mmi"],
        domain=MS,
    )
    y = g.node("Mul", [y, amax], [f"{name}.mmq"])
    if not len(idx):
        return y, bias
    xo = g.node("Gather", [x, g.const(f"{name}.idx", idx)], [f"{name}.xo"], axis=2)
    yo = g.node("MatMul", [xo, g.const(f"{name}.wo", weight[idx])], [f"{name}.yo"])
    return g.node("Add", [y, yo], [f"{name}.mm"]), bias


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
        FF1_OUTLIERS,
    )
    act = g.node("BiasGelu", [f1, f1b], [f"{n}.gelu"], domain=MS)
    # The second feed-forward layer stays in float: its input (after GELU) has outliers that
    # move from layer to layer and token to token, and int8 there cost the most accuracy.
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
