"""The corpus of bench_torch_dropin.py: small custom autograd.Functions, each correct one with a planted-bug
twin, and small nn.Modules (issue 42, item 7). Not a benchmark itself (run_all.py runs bench_*.py only).

A Function is made from a spec: its forward (of its tensor inputs and any non-tensor arguments), its correct
backward and the twin's (both of the saved inputs, the output and grad_output): 45 of them, activations, losses,
normalizations, linear algebra (matmul, bmm, det, inverse, cross), reductions, scans and indexing. The bugs are
the ones people write: a wrong coefficient or sign, a missing grad_output factor, a transposed operand, swapped
gradients, a dropped term (a log, a beta, a mean), an error at one element or for negative inputs only, 1 % off,
an averaged bias gradient, repeated indices overwritten instead of added, a reverse scan run forward.
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


def _rms_norm(x, w):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def _rms_norm_bwd(x, w, g, drop_term: bool):
    n, r = x.shape[-1], torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    gw = g * w
    term = 0 if drop_term else x * (gw * x).sum(-1, keepdim=True) / (n * r ** 3)
    return gw / r - term, (g * x / r).sum(0)


def _shifted(a):
    """a + 2 I: a well-conditioned matrix for inputs in [-1, 1)."""
    return a + 2 * torch.eye(a.shape[-1], dtype=a.dtype)


def _max_row_bwd(x, g, pick):
    out = torch.zeros_like(x)
    return out.scatter_(-1, pick(x, -1).indices.unsqueeze(-1), g.unsqueeze(-1))


def _gather_bwd(x, idx, g, accumulate: bool):
    out = torch.zeros_like(x)
    return (out.index_add_(0, idx, g) if accumulate else out.index_copy_(0, idx, g)), None


def _cumprod_bwd(x, y, g, reverse: bool):
    s = torch.flip(torch.cumsum(torch.flip(g * y, [0]), 0), [0]) if reverse else torch.cumsum(g * y, 0)
    return s / x


_GELU_C = (2 / torch.pi) ** 0.5


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(_GELU_C * (x + 0.044715 * x ** 3)))


def _gelu_tanh_bwd(x, g, drop_term: bool):
    t = torch.tanh(_GELU_C * (x + 0.044715 * x ** 3))
    inner = 0 if drop_term else 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * x * x)
    return (0.5 * (1 + t) + inner) * g


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
    # the second half: activations, losses, linear algebra, reductions and indexing as people write them
    ("Log", torch.log, lambda x, y, g: g / x, lambda x, y, g: g * x),
    ("Sqrt", torch.sqrt, lambda x, y, g: g / (2 * y), lambda x, y, g: g / y),
    ("Reciprocal", torch.reciprocal, lambda x, y, g: -g * y * y, lambda x, y, g: g * y * y),
    ("Erf", torch.erf, lambda x, y, g: 2 / torch.pi ** 0.5 * torch.exp(-x * x) * g,
     lambda x, y, g: 1 / torch.pi ** 0.5 * torch.exp(-x * x) * g),
    ("Atan", torch.atan, lambda x, y, g: g / (1 + x * x), lambda x, y, g: g / (1 + x) ** 2),
    ("GeluTanh", _gelu_tanh, lambda x, y, g: _gelu_tanh_bwd(x, g, False), lambda x, y, g: _gelu_tanh_bwd(x, g, True)),
    ("LogRatio", lambda x: torch.log(x / (3 - x)), lambda x, y, g: 3 * g / (x * (3 - x)), lambda x, y, g: g / x),
    ("SwishBeta", lambda x, b: x * torch.sigmoid(b * x),
     lambda x, b, y, g: ((torch.sigmoid(b * x) * (1 + b * x * (1 - torch.sigmoid(b * x)))) * g, None),
     lambda x, b, y, g: ((torch.sigmoid(b * x) * (1 + x * (1 - torch.sigmoid(b * x)))) * g, None)),  # beta dropped
    ("MseLoss", lambda x, t: ((x - t) ** 2).mean(), lambda x, t, y, g: (2 * (x - t) / x.numel() * g,
                                                                        -2 * (x - t) / x.numel() * g),
     lambda x, t, y, g: (2 * (x - t) / x.numel() * g, 2 * (x - t) / x.numel() * g)),  # the target's sign
    ("SoftmaxXent", lambda x, t: -(t * torch.log_softmax(x, -1)).sum(),
     lambda x, t, y, g: ((torch.softmax(x, -1) * t.sum(-1, keepdim=True) - t) * g, None),
     lambda x, t, y, g: ((torch.softmax(x, -1) - t) * g, None)),  # assumes one-hot rows of sum 1 (not so here)
    ("Linear", lambda x, w, b: x @ w.T + b, lambda x, w, b, y, g: (g @ w, g.T @ x, g.sum(0)),
     lambda x, w, b, y, g: (g @ w, g.T @ x, g.mean(0))),  # bias gradient averaged
    ("Bmm", torch.bmm, lambda a, b, y, g: (g @ b.transpose(1, 2), a.transpose(1, 2) @ g),
     lambda a, b, y, g: (g.transpose(1, 2) @ b.transpose(1, 2), a.transpose(1, 2) @ g)),  # g transposed
    ("Cross", lambda a, b: torch.linalg.cross(a, b), lambda a, b, y, g: (torch.linalg.cross(b, g),
                                                                         torch.linalg.cross(g, a)),
     lambda a, b, y, g: (torch.linalg.cross(g, b), torch.linalg.cross(g, a))),  # a sign
    ("Det", lambda a: torch.linalg.det(_shifted(a)), lambda a, y, g: g * y * torch.linalg.inv(_shifted(a)).T,
     lambda a, y, g: g * y * torch.linalg.inv(_shifted(a))),  # the inverse not transposed
    ("Inverse", lambda a: torch.linalg.inv(_shifted(a)), lambda a, y, g: -y.T @ g @ y.T,
     lambda a, y, g: -y @ g @ y),
    ("MeanDim", lambda x: x.mean(0), lambda x, y, g: g.expand_as(x) / x.shape[0], lambda x, y, g: g.expand_as(x)),
    ("MaxRow", lambda x: x.max(-1).values, lambda x, y, g: _max_row_bwd(x, g, torch.max),
     lambda x, y, g: _max_row_bwd(x, g, torch.min)),
    ("Gather", lambda x, idx: x[idx], lambda x, idx, y, g: _gather_bwd(x, idx, g, True),
     lambda x, idx, y, g: _gather_bwd(x, idx, g, False)),  # repeated indices overwrite instead of adding
    ("RmsNorm", _rms_norm, lambda x, w, y, g: _rms_norm_bwd(x, w, g, False),
     lambda x, w, y, g: _rms_norm_bwd(x, w, g, True)),
    ("Cumprod", lambda x: torch.cumprod(x, 0), lambda x, y, g: _cumprod_bwd(x, y, g, True),
     lambda x, y, g: _cumprod_bwd(x, y, g, False)),
    ("Atan2", torch.atan2, lambda a, b, y, g: (g * b / (a * a + b * b), -g * a / (a * a + b * b)),
     lambda a, b, y, g: (g * b / (a * a + b * b), g * a / (a * a + b * b))),
    ("PowXW", lambda x, w: x ** w, lambda x, w, y, g: (g * w * x ** (w - 1), g * y * torch.log(x)),
     lambda x, w, y, g: (g * w * x ** (w - 1), g * y)),  # the log dropped
]

# the inputs of each spec: (shape, requires_grad, low) per tensor argument, or a Python number
_INPUTS = {"Mul": [((2, 3), True, -1), ((2, 3), True, -1)], "Div": [((2, 3), True, -1), ((2, 3), True, 0.5)],
           "Matmul": [((3, 3), True, -1), ((3, 3), True, -1)], "Hypot": [((4,), True, 0.5), ((4,), True, 0.5)],
           "Outer": [((3,), True, -1), ((3,), True, -1)], "Masked": [((2, 3), True, -1), ((2, 3), False, 0)],
           "PowP": [((4,), True, 0.5), 2.5], "Softmax": [((2, 4), True, -1)], "LayerNorm": [((2, 5), True, -1)],
           "Log": [((5,), True, 0.5)], "Sqrt": [((5,), True, 0.5)], "Reciprocal": [((5,), True, 0.5)],
           "LogRatio": [((5,), True, 0.5)], "SwishBeta": [((5,), True, -1), 1.7],
           "MseLoss": [((2, 3), True, -1), ((2, 3), True, -1)], "SoftmaxXent": [((2, 4), True, -1), ((2, 4), False, 0)],
           "Linear": [((3, 4), True, -1), ((2, 4), True, -1), ((2,), True, -1)],
           "Bmm": [((2, 2, 3), True, -1), ((2, 3, 2), True, -1)], "Cross": [((2, 3), True, -1), ((2, 3), True, -1)],
           "Det": [((3, 3), True, -1)], "Inverse": [((3, 3), True, -1)], "MeanDim": [((3, 4), True, -1)],
           "MaxRow": [((3, 4), True, -1)], "Gather": [((4,), True, -1), torch.tensor([0, 2, 2, 1, 0])],
           "RmsNorm": [((2, 5), True, -1), ((5,), True, 0.5)], "Cumprod": [((5,), True, 0.5)],
           "Atan2": [((4,), True, 0.5), ((4,), True, 0.5)], "PowXW": [((4,), True, 0.5), ((4,), True, 0.5)]}


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
