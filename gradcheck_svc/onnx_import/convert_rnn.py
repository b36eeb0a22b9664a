"""LSTM, GRU and RNN, unrolled over their static sequence length into registry ops (matmul, add, slice,
the gate activations, mul, concat, reshape, transpose), so each step keeps the derivative rules of the
ops it is made of and a fault is named at the step and gate it hits.

Covered: every gate and its bias, peepholes (LSTM), linear_before_reset (GRU), the three directions,
layout 0 and 1, initial states (zeros when absent), the activations Sigmoid, Tanh, Relu, HardSigmoid,
LeakyRelu, Elu and Softplus, and all three outputs (Y, Y_h, Y_c). Refused: sequence_lens shorter than
the sequence (padded steps would need masking), and `clip` and `input_forget`, whose exact placement
runtimes disagree on and no reference checks (ONNX's reference evaluator ignores both).

The input projections of all steps are one matmul per direction (X @ W^T over the whole sequence),
as cuDNN and PyTorch compute them; the recurrent ones are one matmul per step.
"""
from __future__ import annotations

import numpy as np

from .context import Unsupported
from .converters import _present, converter

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _activation(ctx, name: str, alpha, beta):
    """The registry op applying ONNX activation `name`: (op, attrs)."""
    if name in ("Sigmoid", "Tanh", "Relu", "Softplus"):
        return name.lower(), {}
    if name == "HardSigmoid":
        return "hard_sigmoid", {"alpha": 0.2 if alpha is None else alpha, "beta": 0.5 if beta is None else beta}
    if name == "LeakyRelu":
        return "leaky_relu", {"negative_slope": 0.01 if alpha is None else alpha}
    if name == "Elu":
        return "elu", {"alpha": 1.0 if alpha is None else alpha}
    raise Unsupported(f"RNN activation {name}")


class _Unroll:
    def __init__(self, ctx, node, a, kind):
        self.ctx, self.node, self.a, self.kind = ctx, node, a, kind
        self.hidden = int(a["hidden_size"]) if "hidden_size" in a else None
        self.layout = int(a.get("layout", 0))
        for refused in ("clip", "input_forget"):
            if a.get(refused):
                raise Unsupported(f"{kind} with {refused}")
        direction = a.get("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise Unsupported(f"{kind} with direction {direction}")
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        names = a.get("activations") or DEFAULT_ACTIVATIONS[kind] * len(self.directions)
        alphas, betas = list(a.get("activation_alpha", [])), list(a.get("activation_beta", []))
        per = len(DEFAULT_ACTIVATIONS[kind])
        if len(names) != per * len(self.directions):
            raise Unsupported(f"{kind} with {len(names)} activations for {len(self.directions)} direction(s)")
        # ONNX: alpha/beta lists hold values only for the activations that take them, in order
        self.acts, k = [], 0
        for n in names:
            takes = n in ("HardSigmoid", "LeakyRelu", "Elu", "Affine", "ThresholdedRelu", "ScaledTanh")
            al = alphas[k] if takes and k < len(alphas) else None
            be = betas[k] if takes and n == "HardSigmoid" and k < len(betas) else None
            k += takes
            self.acts.append(_activation(ctx, n, al, be))
        self.per = per
        self.split = {}  # R^T of a direction -> its column blocks (GRU)

    def emit(self, op, inputs, attrs=None, name=None):
        return self.ctx.emit(op, inputs, attrs, name=name)

    def act(self, d: int, i: int, x: str) -> str:
        op, attrs = self.acts[d * self.per + i]
        return self.emit(op, [x], attrs)

    def slice0(self, x, i, shape):
        """x[i] of a [num_directions, ...] tensor, reshaped to `shape`."""
        s = self.emit("slice", [x], {"starts": [i], "ends": [i + 1], "axes": [0]})
        return self.emit("reshape", [s], {"shape": list(shape)})

    def gate(self, x, g, h):
        """Chunk g (of width h) of the last axis."""
        return self.emit("slice", [x], {"starts": [g * h], "ends": [(g + 1) * h], "axes": [-1]})

    def run(self):
        ctx, node, kind = self.ctx, self.node, self.kind
        x = ctx.value(node.input[0])
        if self.layout:
            x = self.emit("transpose", [x], {"axes": [1, 0, 2]})
        seq, batch, _ = ctx.shape(x)
        w, r = ctx.value(node.input[1]), ctx.value(node.input[2])
        n_gates = GATES[kind]
        h = self.hidden or ctx.shape(w)[1] // n_gates
        if ctx.shape(w)[1] != n_gates * h:
            raise Unsupported(f"{kind} weights of shape {list(ctx.shape(w))} for hidden_size {h}")
        if _present(node, 4):
            lens = np.asarray(ctx.const(node.input[4], "sequence_lens")).reshape(-1)
            if np.any(lens != seq):
                raise Unsupported(f"{kind} with sequence_lens shorter than the sequence (padded batches)")
        inputs = {i: node.input[i] for i in range(len(node.input)) if _present(node, i)}
        states = {}
        for slot, what in ((5, "h"), (6, "c")):
            if slot in inputs and (kind == "LSTM" or what == "h"):
                s = ctx.value(inputs[slot])
                states[what] = self.emit("transpose", [s], {"axes": [1, 0, 2]}) if self.layout else s
        if kind == "LSTM" and 7 in inputs:
            states["p"] = ctx.value(inputs[7])
        ys, hs, cs = [], [], []
        for d, direction in enumerate(self.directions):
            y, hn, cn = self.direction(d, direction, x, w, r, inputs.get(3), states, seq, batch, h)
            ys.append(y)
            hs.append(hn)
            cs.append(cn)
        return self.outputs(ys, hs, cs, seq, batch, h)

    def direction(self, d, direction, x, w, r, b, states, seq, batch, h):
        ctx, kind, n_gates = self.ctx, self.kind, GATES[self.kind]
        wt = self.emit("transpose", [self.slice0(w, d, (n_gates * h, ctx.shape(w)[2]))])
        rt = self.emit("transpose", [self.slice0(r, d, (n_gates * h, h))])
        xw = self.emit("matmul", [x, wt])  # [seq, batch, G*h]: every step's input projection at once
        rb = None
        if b is not None:
            bias = self.slice0(ctx.value(b), d, (2 * n_gates * h,))
            wb = self.emit("slice", [bias], {"starts": [0], "ends": [n_gates * h], "axes": [0]})
            rb = self.emit("slice", [bias], {"starts": [n_gates * h], "ends": [2 * n_gates * h], "axes": [0]})
            if kind == "GRU" and self.a.get("linear_before_reset"):
                xw = self.emit("add", [xw, wb])  # Rbh stays inside r * (H Rh^T + Rbh)
            else:
                xw = self.emit("add", [xw, self.emit("add", [wb, rb])])
                rb = None
        zeros = None

        def initial(what):
            nonlocal zeros
            if what in states:
                return self.slice0(states[what], d, (batch, h))
            if zeros is None:
                zeros = ctx.add_input(ctx.fresh(f"{self.ctx.onnx_name}/zeros"), np.zeros((batch, h)), False,
                                      ctx.float_dtype)
            return zeros

        hp, cp = initial("h"), initial("c") if kind == "LSTM" else None
        peep = [self.gate(self.slice0(states["p"], d, (3 * h,)), i, h) for i in range(3)] if "p" in states else None
        steps = range(seq) if direction == "forward" else range(seq - 1, -1, -1)
        out = [None] * seq
        for t in steps:
            xt = self.emit("reshape", [self.emit("slice", [xw], {"starts": [t], "ends": [t + 1], "axes": [0]})],
                           {"shape": [batch, n_gates * h]})
            if kind == "GRU":
                hp = self.gru_step(d, xt, hp, rt, rb, h)
            elif kind == "RNN":
                hp = self.act(d, 0, self.emit("add", [xt, self.emit("matmul", [hp, rt])]))
            else:
                hp, cp = self.lstm_step(d, xt, hp, cp, rt, peep, h)
            out[t] = hp
        return out, hp, cp

    def lstm_step(self, d, xt, hp, cp, rt, peep, h):
        pre = self.emit("add", [xt, self.emit("matmul", [hp, rt])])
        gi, go, gf, gc = (self.gate(pre, g, h) for g in range(4))  # ONNX's order: i, o, f, c
        if peep is not None:
            gi = self.emit("add", [gi, self.emit("mul", [peep[0], cp])])
            gf = self.emit("add", [gf, self.emit("mul", [peep[2], cp])])
        i, f = self.act(d, 0, gi), self.act(d, 0, gf)
        c = self.emit("add", [self.emit("mul", [f, cp]), self.emit("mul", [i, self.act(d, 1, gc)])])
        if peep is not None:
            go = self.emit("add", [go, self.emit("mul", [peep[1], c])])
        o = self.act(d, 0, go)
        return self.emit("mul", [o, self.act(d, 2, c)]), c

    def gru_step(self, d, xt, hp, rt, rb, h):
        lbr = self.a.get("linear_before_reset")
        if rt not in self.split:  # R^T's columns: gates z and r, and gate h (read after the reset)
            self.split[rt] = (self.emit("slice", [rt], {"starts": [0], "ends": [2 * h], "axes": [-1]}),
                              self.emit("slice", [rt], {"starts": [2 * h], "ends": [3 * h], "axes": [-1]}))
        rzr, rh = self.split[rt]
        hr = self.emit("matmul", [hp, rt if lbr else rzr])
        if rb is not None:  # linear_before_reset: all of Rb here (Rbh inside the reset's product)
            hr = self.emit("add", [hr, rb])
        xz, xr, xh = (self.gate(xt, g, h) for g in range(3))
        z = self.act(d, 0, self.emit("add", [xz, self.gate(hr, 0, h)]))
        r = self.act(d, 0, self.emit("add", [xr, self.gate(hr, 1, h)]))
        if lbr:  # h~ = g(X Wh^T + r * (H Rh^T + Rbh) + Wbh)
            hh = self.emit("mul", [r, self.gate(hr, 2, h)])
        else:  # h~ = g(X Wh^T + (r * H) Rh^T + Rbh + Wbh)
            hh = self.emit("matmul", [self.emit("mul", [r, hp]), rh])
        n = self.act(d, 1, self.emit("add", [xh, hh]))
        # H = (1 - z) * h~ + z * H_prev, written h~ + z * (H_prev - h~)
        return self.emit("add", [n, self.emit("mul", [z, self.emit("sub", [hp, n])])])

    def outputs(self, ys, hs, cs, seq, batch, h):
        node, nd = self.node, len(self.directions)
        names = list(node.output) + [""] * (3 - len(node.output))
        result = []
        if names[0]:
            steps = []
            for t in range(seq):
                per_dir = [self.emit("reshape", [ys[d][t]], {"shape": [1, 1, batch, h]}) for d in range(nd)]
                steps.append(per_dir[0] if nd == 1 else self.emit("concat", per_dir, {"axis": 1}))
            if self.layout:
                y = steps[0] if seq == 1 else self.emit("concat", steps, {"axis": 0})
                result.append(self.emit("transpose", [y], {"axes": [2, 0, 1, 3]}, name=names[0]))
            else:
                result.append(self.emit("concat", steps, {"axis": 0}, name=names[0]) if seq > 1 else
                              self.emit("reshape", [steps[0]], {"shape": [1, nd, batch, h]}, name=names[0]))
        else:
            result.append("")
        for name, finals in ((names[1], hs), (names[2], cs)):
            if not name or finals[0] is None:
                result.append("")
                continue
            parts = [self.emit("reshape", [f], {"shape": [1, batch, h]}) for f in finals]
            v = parts[0] if nd == 1 else self.emit("concat", parts, {"axis": 0})
            if self.layout:
                result.append(self.emit("transpose", [v], {"axes": [1, 0, 2]}, name=name))
            else:
                result.append(self.emit("reshape", [v], {"shape": [nd, batch, h]}, name=name))
        return result[:len(node.output)]


@converter("LSTM", "GRU", "RNN")
def _rnn(ctx, node, a, opset):
    return _Unroll(ctx, node, a, node.op_type).run()
