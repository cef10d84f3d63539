"""Tiny hand-built ONNX graphs with the decomposed forms the passes fuse, and broken look-alikes.

A `GraphBuilder` appends blocks to a running float tensor x [batch, seq, E]; each block records
whether it is a complete pattern (must be fused) or an incomplete one (must be left alone).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

E, H = 16, 2
D = E // H


@dataclasses.dataclass
class GraphBuilder:
    """Accumulates nodes/initializers; `x` is the current tensor name."""

    opset: int = 18
    seed: int = 0
    nodes: list = dataclasses.field(default_factory=list)
    inits: list = dataclasses.field(default_factory=list)
    inputs: list = dataclasses.field(default_factory=list)
    expect: dict = dataclasses.field(default_factory=dict)
    x: str = "x"
    _n: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", E]))

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def const(self, value, stem: str = "c", as_node: bool = False) -> str:
        """A constant as an initializer, or as a Constant node."""
        arr = np.asarray(value, dtype=np.float32 if np.asarray(value).dtype.kind == "f" else np.int64)
        name = self.name(stem)
        if as_node:
            self.nodes.append(
                helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name))
            )
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs) -> str:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.name(f"n_{op_type}"), **attrs)
        )
        return outs[0]

    def count(self, key: str) -> None:
        self.expect[key] = self.expect.get(key, 0) + 1

    def mask_input(self) -> str:
        if not any(i.name == "attention_mask" for i in self.inputs):
            self.inputs.append(
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
            )
        return "attention_mask"

    def reduce_mean(self, x: str, axis: int) -> str:
        """ReduceMean over one axis: axes as an input from opset 18, as an attribute before."""
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.const([axis], "axes"), keepdims=1)
        return self.op("ReduceMean", x, axes=[axis], keepdims=1)

    # --- blocks ---------------------------------------------------------------------------
    def layernorm(self, square="pow", div="div", bias=True, eps_node=False, scale_first=False, complete=True):
        x = self.x
        mean = self.reduce_mean(x, -1)
        d = self.op("Sub", x, mean)
        sq = self.op("Pow", d, self.const(2.0)) if square == "pow" else self.op("Mul", d, d)
        var = self.reduce_mean(sq, -1 if complete else -2)
        std = self.op("Sqrt", self.op("Add", var, self.const(1e-5, "eps", as_node=eps_node)))
        y = self.op("Div", d, std) if div == "div" else self.op("Mul", d, self.op("Reciprocal", std))
        scale = self.const(self.rng.standard_normal(E).astype(np.float32), "gamma")
        y = self.op("Mul", scale, y) if scale_first else self.op("Mul", y, scale)
        if bias:
            y = self.op("Add", y, self.const(self.rng.standard_normal(E).astype(np.float32), "beta"))
        self.x = y
        self.count("LayerNormalization" if complete else "ln_incomplete")

    def gelu(self, form="erf", grouping="xh_g", div=True, complete=True):
        x = self.x
        if form == "erf":
            inner = (
                self.op("Div", x, self.const(math.sqrt(2)))
                if div
                else self.op("Mul", x, self.const(1 / math.sqrt(2)))
            )
            g = self.op("Add", self.op("Erf", inner), self.const(1.0))
        else:
            cube = self.op("Pow", x, self.const(3.0)) if div else self.op("Mul", self.op("Mul", x, x), x)
            t = self.op("Add", x, self.op("Mul", self.const(0.044715), cube))
            g = self.op(
                "Add", self.const(1.0), self.op("Tanh", self.op("Mul", t, self.const(math.sqrt(2 / math.pi))))
            )
        half = self.const(0.5 if complete else 0.45)
        if grouping == "xh_g":
            y = self.op("Mul", self.op("Mul", half, x), g)
        elif grouping == "xg_h":
            y = self.op("Mul", self.op("Mul", g, x), half)
        else:
            y = self.op("Mul", x, self.op("Mul", half, g))
        self.x = y
        self.count("Gelu" if complete else "gelu_incomplete")

    def unrelated(self, kind="relu"):
        x = self.x
        if kind == "relu":
            self.x = self.op("Relu", x)
        elif kind == "tanh":
            self.x = self.op("Tanh", x)
        elif kind == "affine":
            self.x = self.op("Add", self.op("Mul", x, self.const(0.7)), self.const(0.1))
        else:
            self.x = self.op("Sigmoid", x)

    def attention(self, key="bhsd", scale="qk_div", mask="none", bias=True, complete=True, score_bias=False):
        """One attention block; `score_bias` adds a per-head bias to the scores before the mask (MPNet)."""
        x = self.x

        def proj(stem):
            w = self.const((self.rng.standard_normal((E, E)) / math.sqrt(E)).astype(np.float32), f"w{stem}")
            y = self.op("MatMul", x, w)
            if bias:
                y = self.op(
                    "Add", y, self.const(self.rng.standard_normal(E).astype(np.float32) * 0.1, f"b{stem}")
                )
            return self.op("Reshape", y, self.const(np.array([0, 0, H, D], dtype=np.int64), "shape"))

        q4, k4, v4 = proj("q"), proj("k"), proj("v")
        q = self.op("Transpose", q4, perm=[0, 2, 1, 3])
        v = self.op("Transpose", v4, perm=[0, 2, 1, 3])
        if key == "bhsd":
            kt = self.op("Transpose", self.op("Transpose", k4, perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2])
        else:
            kt = self.op("Transpose", k4, perm=[0, 2, 3, 1])
        if scale == "split":
            s = self.const(D**-0.25)
            scores = self.op("MatMul", self.op("Mul", q, s), self.op("Mul", kt, s))
        elif scale == "qk_div":
            scores = self.op("Div", self.op("MatMul", q, kt), self.const(math.sqrt(D)))
        else:
            scores = self.op("Mul", self.op("MatMul", q, kt), self.const(1 / math.sqrt(D)))
        if score_bias:
            per_head = self.rng.standard_normal((1, H, 1, 1)).astype(np.float32)
            scores = self.op("Add", scores, self.const(per_head, "score_bias"))
        if mask in ("causal", "causal_window"):
            scores = self.op("Add", scores, self.position_mask(window=3 if mask == "causal_window" else None))
        elif mask != "none":
            m = self.op("Cast", self.mask_input(), to=TensorProto.FLOAT)
            m = self.op("Mul", self.op("Sub", self.const(1.0), m), self.const(-10000.0))
            m = self.op("Unsqueeze", m, self.const(np.array([1, 2], dtype=np.int64), "axes"))
            scores = self.op("Add", scores, m) if mask == "right" else self.op("Add", m, scores)
        p = self.op("Softmax", scores, axis=-1 if complete else 2)
        o = self.op("MatMul", p, v)
        o = self.op("Transpose", o, perm=[0, 2, 1, 3])
        self.x = self.op("Reshape", o, self.const(np.array([0, 0, E], dtype=np.int64), "shape"))
        self.count("Attention" if complete else "attention_incomplete")

    def position_mask(self, window: int | None = None) -> str:
        """Additive [S, S] mask from positions: causal (k <= q), with `window` also k > q - window."""
        seq = self.op("Gather", self.op("Shape", self.x), self.const(np.array(1, dtype=np.int64)), axis=0)
        idx = self.op(
            "Range", self.const(np.array(0, dtype=np.int64)), seq, self.const(np.array(1, dtype=np.int64))
        )
        q = self.op("Unsqueeze", idx, self.const(np.array([1], dtype=np.int64), "axes"))  # [S, 1]
        k = self.op("Unsqueeze", idx, self.const(np.array([0], dtype=np.int64), "axes"))  # [1, S]
        keep = self.op("LessOrEqual", k, q)
        if window is not None:
            lowest = self.op("Sub", q, self.const(np.array(window, dtype=np.int64)))
            keep = self.op("And", keep, self.op("Greater", k, lowest))
        return self.op("Where", keep, self.const(0.0), self.const(-1e9))

    def build(self) -> onnx.ModelProto:
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", E])
        self.nodes.append(helper.make_node("Identity", [self.x], ["y"], name="out_identity"))
        graph = helper.make_graph(self.nodes, "g", self.inputs, [out], initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 10
        onnx.checker.check_model(model)
        return model


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Execute with an exact ORT CPU session, graph optimizations off (what the verifier does)."""
    from trtforge.numerics.sessions import exact_session

    return exact_session(model).run(None, feeds)


def feeds_for(model: onnx.ModelProto, batch: int = 2, seq: int = 5, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        if i.name == "x":
            out["x"] = rng.standard_normal((batch, seq, E)).astype(np.float32)
        elif i.name == "attention_mask":
            m = np.ones((batch, seq), dtype=np.int64)
            m[-1, -2:] = 0
            out[i.name] = m
    return out


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts
