"""The corpus of bench_torch_dropin.py: small custom autograd.Functions, each correct one with a planted-bug
twin, and small nn.Modules (issue 42, item 7). Not a benchmark itself (run_all.py runs bench_*.py only).

A Function is made from a spec: its forward (of its tensor inputs and any non-tensor arguments), its correct
backward and the twin's (both of the saved inputs, the output and grad_output). The bugs are the ones people
write: a wrong coefficient or sign, a missing grad_output factor, a transposed operand, swapped gradients, a
dropped term, an error at one element or for negative inputs only, 1 % off.
"""
from __future__ import annotations

import torch

D = torch.float64


def _function(name: str, forward, backward, needs=None):
    """A custom autograd.Function class: y = forward(*inputs); backward(saved inputs, y, g) -> input grads."""
    def fwd(ctx, *inputs):
        ctx.save_for_backward(*[t for t in inputs if isinstance(t, torch.Tensor)])
        ctx.others = [a for a in inputs if not isinstance(a, torch.Tensor)]
        y = forward(*inputs)
        ctx.y = y.detach()
        return y

    def bwd(ctx, g):
        return backward(*ctx.saved_tensors, *ctx.others, y=ctx.y, g=g)
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


def _one_element(grad):
    grad = grad.clone()
    grad.view(-1)[0] *= 1.5
    return grad


def _softmax_bwd(y, g):
    return y * (g - (g * y).sum(-1, keepdim=True))


def _layer_norm(x):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)


def _layer_norm_bwd(x, g, drop_mean: bool):
    n = x.shape[-1]
    xhat, inv = _layer_norm(x), 1.0 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    mean_term = 0 if drop_mean else g.mean(-1, keepdim=True)
    return inv * (g - mean_term - xhat * (g * xhat).sum(-1, keepdim=True) / n)


def _norm_bwd(x, y, g, right: bool):
    r = x.norm()
    return (g - y * (y * g).sum()) / r if right else g / r


# (name, forward, correct backward, buggy backward, input shapes (None: a non-tensor argument), args maker)
SPECS = [
    ("Cube", lambda x: x ** 3, lambda x, y, g: 3 * x * x * g, lambda x, y, g: 2 * x * x * g),
    ("Sin", torch.sin, lambda x, y, g: torch.cos(x) * g, lambda x, y, g: -torch.cos(x) * g),
    ("Exp", torch.exp, lambda x, y, g: y * g, lambda x, y, g: y),  # not multiplied by grad_output
    ("Tanh", torch.tanh, lambda x, y, g: (1 - y * y) * g, lambda x, y, g: (1 - y) * g),
    ("Sigmoid", torch.sigmoid, lambda x, y, g: y * (1 - y) * g, lambda x, y, g: y * g),
    ("Softplus", torch.nn.functional.softplus, lambda x, y, g: torch.sigmoid(x) * g,
     lambda x, y, g: 1.01 * torch.sigmoid(x) * g),  # 1 % off
    ("LogSquare", lambda x: torch.log1p(x * x), lambda x, y, g: 2 * x / (1 + x * x) * g,
     lambda x, y, g: 2 * x / (1 + x.abs()) * g),
    ("SumSquares", lambda x: (x * x).sum(), lambda x, y, g: 2 * x * g, lambda x, y, g: x * g),
    ("Cumsum", lambda x: torch.cumsum(x, 0), lambda x, y, g: torch.flip(torch.cumsum(torch.flip(g, [0]), 0), [0]),
     lambda x, y, g: torch.cumsum(g, 0)),
    ("Softmax", lambda x: torch.softmax(x, -1), lambda x, y, g: _softmax_bwd(y, g), lambda x, y, g: y * g),
    ("Normalize", lambda x: x / x.norm(), lambda x, y, g: _norm_bwd(x, y, g, True),
     lambda x, y, g: _norm_bwd(x, y, g, False)),
    ("LogSumExp", lambda x: torch.logsumexp(x, 0), lambda x, y, g: torch.exp(x - y) * g,
     lambda x, y, g: torch.exp(x) * g),
    ("OneElement", lambda x: x ** 3, lambda x, y, g: 3 * x * x * g, lambda x, y, g: _one_element(3 * x * x * g)),
    ("LeakyRelu", lambda x: torch.where(x > 0, x, 0.1 * x), lambda x, y, g: torch.where(x > 0, g, 0.1 * g),
     lambda x, y, g: torch.where(x > 0, g, 0.01 * g)),  # wrong for negative inputs only
    ("Silu", lambda x: x * torch.sigmoid(x),
     lambda x, y, g: (torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))) * g,
     lambda x, y, g: torch.sigmoid(x) * g),  # a dropped term
    ("LayerNorm", _layer_norm, lambda x, y, g: _layer_norm_bwd(x, g, False),
     lambda x, y, g: _layer_norm_bwd(x, g, True)),
    ("Mul", lambda x, w: x * w, lambda x, w, y, g: (g * w, g * x), lambda x, w, y, g: (g * w, g * w)),
    ("Div", lambda x, w: x / w, lambda x, w, y, g: (g / w, -g * x / (w * w)),
     lambda x, w, y, g: (g / w, g * x / (w * w))),  # wrong sign
    ("Matmul", lambda a, b: a @ b, lambda a, b, y, g: (g @ b.T, a.T @ g), lambda a, b, y, g: (g @ b, a.T @ g)),
    ("Hypot", lambda x, w: torch.sqrt(x * x + w * w), lambda x, w, y, g: (g * x / y, g * w / y),
     lambda x, w, y, g: (g * w / y, g * x / y)),  # swapped
    ("Outer", lambda x, w: torch.outer(x, w), lambda x, w, y, g: (g @ w, g.T @ x),
     lambda x, w, y, g: (g @ w, g @ x)),  # transposed
    ("Masked", lambda x, m: x * m, lambda x, m, y, g: (g * m, None), lambda x, m, y, g: (g, None)),
    ("PowP", lambda x, p: x ** p, lambda x, p, y, g: (p * x ** (p - 1) * g, None),
     lambda x, p, y, g: (p * x ** p * g, None)),
]

# the inputs of each spec: (shape, requires_grad, low) per tensor argument, or a Python number
_INPUTS = {"Mul": [((2, 3), True, -1), ((2, 3), True, -1)], "Div": [((2, 3), True, -1), ((2, 3), True, 0.5)],
           "Matmul": [((3, 3), True, -1), ((3, 3), True, -1)], "Hypot": [((4,), True, 0.5), ((4,), True, 0.5)],
           "Outer": [((3,), True, -1), ((3,), True, -1)], "Masked": [((2, 3), True, -1), ((2, 3), False, 0)],
           "PowP": [((4,), True, 0.5), 2.5], "Softmax": [((2, 4), True, -1)], "LayerNorm": [((2, 5), True, -1)]}


def inputs_of(name: str, seed: int):
    """The inputs of a spec's Function, seeded: uniform in [low, low + 2), float64."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in _INPUTS.get(name, [((5,), True, -1)]):
        if not isinstance(spec, tuple):
            out.append(spec)
            continue
        shape, grad, low = spec
        out.append((low + 2 * torch.rand(shape, generator=gen, dtype=D)).requires_grad_(grad))
    return tuple(out)


def functions():
    """[(name, Function class, inputs, planted bug?)]: each spec's correct Function and its twin."""
    out = []
    for k, (name, forward, right, wrong) in enumerate(SPECS):
        for bug, backward in ((False, right), (True, wrong)):
            cls = _function(name + ("Bug" if bug else ""), forward, backward)
            out.append((cls.__name__, cls, inputs_of(name, k), bug))
    return out


class _Mlp(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), act, torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class _Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        h = torch.nn.functional.avg_pool2d(torch.nn.functional.gelu(self.conv(x)), 2)
        return self.head(h.flatten(1))


class _Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.lin = torch.nn.LayerNorm(12), torch.nn.Linear(12, 12)

    def forward(self, x):
        return x + self.lin(torch.tanh(self.norm(x)))


class _Gru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = torch.nn.GRU(4, 6, batch_first=True), torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class _Lstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 5, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


def modules():
    """[(name, module (float64, eval mode), input)]: small modules, <= 100k parameters."""
    torch.manual_seed(0)
    specs = [("MLP tanh", _Mlp(torch.nn.Tanh()), (3, 8)), ("MLP GELU", _Mlp(torch.nn.GELU()), (3, 8)),
             ("conv + GELU + pool", _Conv(), (2, 2, 6, 6)), ("LayerNorm residual", _Residual(), (3, 12)),
             ("GRU", _Gru(), (2, 3, 4)), ("LSTM", _Lstm(), (2, 3, 4)),
             ("transformer layer (SDPA)", torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                            batch_first=True), (2, 3, 8))]
    out = []
    for name, m, shape in specs:
        m = m.to(D).eval()
        out.append((name, m, torch.randn(shape, dtype=D, requires_grad=True)))
    return out
