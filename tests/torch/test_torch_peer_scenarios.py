"""The gradcheck drop-in against torch.autograd.gradcheck, scenario by scenario, from torch 2.13's documented
semantics (torch/autograd/gradcheck.py): each case runs both on the same function and inputs and asserts
torch's outcome (so the case is the scenario it names), ours, and that ours is torch's or stricter --
the same return value, the same exception class (ours a subclass of torch's GradcheckError), or a
GradcheckError where torch returns True. Then the planted-bug twins: each bug caught and named, its
correct twin passing."""
from __future__ import annotations

import importlib
import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")  # torch is an optional extra of the client (installed in the test venv)

from gradcheck_client.torch import GradcheckError, check, gradcheck, gradgradcheck, surrogate  # noqa: E402
from grpc_helpers import module_server  # noqa: E402

tg = importlib.import_module("torch.autograd.gradcheck")
D = torch.float64


def x3(*values, dtype=D, grad=True):
    return torch.tensor(values or (0.3, -0.7, 1.1), dtype=dtype, requires_grad=grad)


def z2():
    return torch.tensor([0.3 + 0.2j, -0.5 + 1j], dtype=torch.complex128, requires_grad=True)


def function(forward, backward, jvp=None, materialize=True):
    """A custom autograd.Function y = forward(x) with the given backward(x, g) (and jvp(x, t))."""
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return backward(x, g)

        @staticmethod
        def jvp(ctx, t):
            return jvp(ctx.saved_for_forward, t)
    if jvp is not None:
        Fn.forward = staticmethod(_saving_for_forward(forward))
    return Fn


def _saving_for_forward(forward):
    def fwd(ctx, x):
        ctx.save_for_backward(x)
        ctx.saved_for_forward = x.detach()
        return forward(x)
    return fwd


CUBE = function(lambda x: x * x * x, lambda x, g: g * 3 * x * x)
CUBE_OFF = function(lambda x: x * x * x, lambda x, g: g * 3 * x * x * 1.01)
NOISY = function(lambda x: x * x * x, lambda x, g: g * 3 * x * x * (1 + torch.rand_like(x) * 1e-9))
NOT_BY_G = function(lambda x: (x * x * x).sum(), lambda x, g: 3 * x * x)  # right at g = 1 only
UNDEFINED = function(lambda x: x * x * x, lambda x, g: torch.ones_like(x) if g is None else g * 3 * x * x,
                     materialize=False)
UNBATCHABLE = function(lambda x: x * x * x, lambda x, g: g * 3 * x * x * (float(g.sum()) * 0 + 1))
COMPLEX_UNCONJUGATED = function(lambda z: z * z, lambda z, g: g * 2 * z)  # torch's convention: g * conj(2 z)
FWD_RIGHT = function(lambda x: x * x * x, lambda x, g: g * 3 * x * x, jvp=lambda x, t: 3 * x * x * t)
FWD_WRONG = function(lambda x: x * x * x, lambda x, g: g * 3 * x * x, jvp=lambda x, t: 2 * x * x * t)


def _raises(exc):
    raise exc


class CastsItsGradient(torch.autograd.Function):
    """x * x whose backward returns float32 for a float64 input: torch's engine casts it to the input's dtype
    before anything sees it, so check_grad_dtypes has nothing to fail (torch: True)."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return (2 * x * g).float()


class ComplexTangent(CastsItsGradient):
    """x * x whose forward-mode tangent is complex for a real output: check_grad_dtypes' failing case."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.x = x.detach()
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 2 * x * g

    @staticmethod
    def jvp(ctx, t):
        return (2 * ctx.x * t).to(torch.complex128)


def _seeded(module):
    """The module in float64, eval mode, its parameters drawn from a fixed generator (the global one left)."""
    generator = torch.Generator().manual_seed(0)
    module = module.to(D).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=D) * 0.5)
    return module


class IndexPutView(torch.nn.Module):
    """Rows 0 and 2 of a view of the activations rewritten in place (`v[[0, 2]] = ...`: aten::index_put_)."""
    def __init__(self, hook=None):
        super().__init__()
        self.lin, self.hook = torch.nn.Linear(4, 4), hook

    def forward(self, x):
        h = self.lin(x).clone()
        v = h[:, 1:]
        v[[0, 2]] = torch.tanh(v[[0, 2]]) * 2
        if self.hook is not None:
            h.register_hook(self.hook)
        return h


class GroupedQueryAttention(torch.nn.Module):
    """scaled_dot_product_attention with 4 query heads sharing 2 key/value heads (enable_gqa=True)."""
    def __init__(self, hook=None):
        super().__init__()
        self.hook = hook

    def forward(self, q, k, v):
        if self.hook is not None:
            k = k * 1.0
            k.register_hook(self.hook)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _doubled(g):
    return g * 2


INDEX_PUT, INDEX_PUT_HOOKED = _seeded(IndexPutView()), _seeded(IndexPutView(_doubled))


def rows():
    return (torch.linspace(-1, 1, 12, dtype=D).reshape(3, 4).sin().requires_grad_(True),)


def qkv():
    # (2 positions: the causal mask still hides one key from one query; a third cost time, proved nothing more)
    return tuple(torch.linspace(-1, 1, n * 2 * 2, dtype=D).mul(k + 1).cos().reshape(1, n, 2, 2).requires_grad_(True)
                 for k, n in enumerate((4, 2, 2)))


def _sparse():
    return torch.tensor([[0.0, 0.5], [-0.7, 0.0]], dtype=D).to_sparse().requires_grad_(True)


# (name, fn, inputs (a factory: each tool gets its own), keywords, torch's outcome, ours)
# an outcome: True, False, or the exception class raised (ours: GradcheckError is gradcheck_client's)
class WithStatistic(torch.autograd.Function):
    """sin(x), and a float statistic of x returned beside it, marked non-differentiable (its backward gives it
    no gradient, by declaration)."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        norm = (x * x).sum()
        ctx.mark_non_differentiable(norm)
        return torch.sin(x), norm

    @staticmethod
    def backward(ctx, g, _):
        x, = ctx.saved_tensors
        return g * torch.cos(x)


def full3(grad=True):
    """A full 3x3 matrix with a well-conditioned diagonal: a triangle-reading op's unread triangle nonzero."""
    a = torch.tensor([[1.9, 0.4, -0.7], [0.3, 2.2, 0.5], [-0.6, 0.8, 2.5]], dtype=D)
    return a.requires_grad_(grad)


def _solve_triangular(upper: bool, unit: bool):
    b = torch.tensor([[0.4, -1.0], [0.3, 0.8], [-0.5, 0.2]], dtype=D)
    return lambda a: torch.linalg.solve_triangular(a, b, upper=upper, unitriangular=unit)


SCENARIOS = [
    ("jacobian right", torch.tanh, lambda: (x3(),), {}, True, True),
    ("jacobian wrong", CUBE_OFF.apply, lambda: (x3(),), {}, tg.GradcheckError, GradcheckError),
    ("raise_exception=False", CUBE_OFF.apply, lambda: (x3(),), {"raise_exception": False}, False, False),
    ("fn raises, raise_exception=False", lambda x: _raises(RuntimeError("the user's own")), lambda: (x3(),),
     {"raise_exception": False}, RuntimeError, RuntimeError),
    ("nondeterministic backward", NOISY.apply, lambda: (x3(),), {}, tg.GradcheckError, GradcheckError),
    ("nondeterministic backward within nondet_tol", NOISY.apply, lambda: (x3(),), {"nondet_tol": 1e-6}, True,
     True),
    ("backward not multiplied by grad_output", NOT_BY_G.apply, lambda: (x3(),), {}, tg.GradcheckError,
     GradcheckError),
    ("undefined output grads mishandled", UNDEFINED.apply, lambda: (x3(),), {}, tg.GradcheckError,
     GradcheckError),
    ("undefined output grads unchecked", UNDEFINED.apply, lambda: (x3(),), {"check_undefined_grad": False}, True,
     True),
    ("batched grad right", CUBE.apply, lambda: (x3(),), {"check_batched_grad": True}, True, True),
    ("batched grad unbatchable", UNBATCHABLE.apply, lambda: (x3(),), {"check_batched_grad": True},
     tg.GradcheckError, GradcheckError),
    ("forward AD right", FWD_RIGHT.apply, lambda: (x3(),), {"check_forward_ad": True}, True, True),
    ("forward AD wrong", FWD_WRONG.apply, lambda: (x3(),), {"check_forward_ad": True}, tg.GradcheckError,
     GradcheckError),
    ("forward AD only", FWD_WRONG.apply, lambda: (x3(),), {"check_forward_ad": True, "check_backward_ad": False},
     tg.GradcheckError, GradcheckError),
    ("both AD modes off", torch.tanh, lambda: (x3(),), {"check_backward_ad": False}, AssertionError,
     AssertionError),
    ("batched grad without backward AD", torch.tanh, lambda: (x3(),),
     {"check_batched_grad": True, "check_backward_ad": False, "check_forward_ad": True}, AssertionError,
     AssertionError),
    ("check_grad_dtypes", torch.tanh, lambda: (x3(),), {"check_grad_dtypes": True}, True, True),
    ("fast_mode right", torch.tanh, lambda: (x3(),), {"fast_mode": True}, True, True),
    ("fast_mode wrong", CUBE_OFF.apply, lambda: (x3(),), {"fast_mode": True}, tg.GradcheckError,
     GradcheckError),
    ("sparse input, masked", lambda s: torch.sin(s.to_dense()), lambda: (_sparse(),), {"masked": True}, True,
     True),
    ("sparse output", lambda x: x.to_sparse(), lambda: (x3(),), {}, ValueError, ValueError),
    ("complex input", lambda z: (z * z).abs(), lambda: (z2(),), {}, True, True),
    ("complex output", lambda x: x * (1 + 2j), lambda: (x3(),), {}, True, True),
    ("complex, wrong backward", COMPLEX_UNCONJUGATED.apply,
     lambda: (z2(),), {}, tg.GradcheckError, GradcheckError),
    ("stride-0 input", torch.tanh, lambda: (torch.tensor([0.3], dtype=D).expand(3).requires_grad_(True),), {},
     RuntimeError, RuntimeError),
    ("output shape depends on the values", lambda x: x[x > 0], lambda: (x3(0.0, 0.5, -0.7),), {},
     AssertionError, AssertionError),
    ("a non-differentiable output", lambda x: (torch.sin(x), torch.argmax(x)), lambda: (x3(),), {}, True, True),
    ("a float output marked non-differentiable", WithStatistic.apply, lambda: (x3(),), {}, True, True),
    ("no differentiable output, zero derivative", lambda x: (x > 0).to(D), lambda: (x3(),), {}, True, True),
    ("no differentiable output, nonzero derivative", lambda x: x.detach() * 2, lambda: (x3(),), {},
     tg.GradcheckError, GradcheckError),
    ("no input requires grad", torch.tanh, lambda: (x3(grad=False),), {}, ValueError, ValueError),
    ("a detach in the forward", lambda x: x * x.detach(), lambda: (x3(),), {}, tg.GradcheckError,
     GradcheckError),
    ("float32 input", torch.tanh, lambda: (x3(dtype=torch.float32),), {"raise_exception": False}, False, False),
    ("check_grad_dtypes, a backward returning float32 (torch's engine casts it)", CastsItsGradient.apply,
     lambda: (x3(),), {"check_grad_dtypes": True}, True, True),
    ("check_grad_dtypes, a complex tangent for a real output", ComplexTangent.apply, lambda: (x3(),),
     {"check_grad_dtypes": True, "check_forward_ad": True}, tg.GradcheckError, GradcheckError),
    ("index_put_ on a view in a module", INDEX_PUT, rows, {}, True, True),
    ("index_put_ on a view, a hook doubling the gradient", INDEX_PUT_HOOKED, rows, {}, tg.GradcheckError,
     GradcheckError),
    ("grouped-query attention (enable_gqa)", GroupedQueryAttention(), qkv, {}, True, True),
    ("grouped-query attention, a hook doubling k's gradient", GroupedQueryAttention(_doubled), qkv, {},
     tg.GradcheckError, GradcheckError),
    # ops reading one triangle (opaque.READS_TRIANGLE), the other nonzero: torch's VJP there is 0
    # (solve_triangular) or read from a triangular argument (cholesky_inverse of L.tril()); on a full L,
    # cholesky_inverse's backward reads the unread triangle, and both fail
    ("solve_triangular upper, a full matrix", _solve_triangular(True, False), lambda: (full3(),), {}, True, True),
    ("solve_triangular lower unitriangular, a full matrix", _solve_triangular(False, True), lambda: (full3(),), {},
     True, True),
    ("cholesky_inverse of L.tril()", lambda a: torch.cholesky_inverse(a.tril()), lambda: (full3(),), {}, True,
     True),
    ("cholesky_inverse upper of U.triu()", lambda a: torch.cholesky_inverse(a.triu(), upper=True),
     lambda: (full3(),), {}, True, True),
    ("cholesky_inverse of a full matrix", torch.cholesky_inverse, lambda: (full3(),), {}, tg.GradcheckError,
     GradcheckError),
]


def outcome(tool, fn, inputs, keywords):
    """What tool(fn, inputs, **keywords) did: its return value, or the exception it raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return tool(fn, inputs, **keywords)
        except Exception as exc:  # noqa: BLE001 (the outcome under test)
            return exc


def kind(result):
    return type(result) if isinstance(result, BaseException) else result


def same_or_stricter(theirs, ours) -> bool:
    """Ours is torch's outcome or a stricter one: the same value, an instance of the class torch raised, or a
    gradient failure where torch returned True (never True or False where torch raised)."""
    if isinstance(theirs, BaseException):
        return isinstance(ours, type(theirs))
    return ours is theirs or (theirs is True and isinstance(ours, GradcheckError))


@pytest.mark.parametrize("name, fn, inputs, keywords, torch_outcome, our_outcome", SCENARIOS,
                         ids=[s[0] for s in SCENARIOS])
def test_torchs_outcome_or_a_stricter_one(name, fn, inputs, keywords, torch_outcome, our_outcome):
    theirs = outcome(torch.autograd.gradcheck, fn, inputs(), keywords)
    ours = outcome(gradcheck, fn, inputs(), keywords)
    assert kind(theirs) is torch_outcome, f"torch: {theirs!r}"  # the case is the scenario it names
    assert kind(ours) is our_outcome, f"ours: {ours!r}"
    assert same_or_stricter(theirs, ours)


def test_a_gradient_failure_is_torchs_gradcheck_error_with_the_localized_report():
    with pytest.raises(tg.GradcheckError) as caught:
        gradcheck(CUBE_OFF.apply, (x3(),))
    assert isinstance(caught.value, RuntimeError) and issubclass(GradcheckError, tg.GradcheckError)
    first = str(caught.value).splitlines()[0]
    line = inspect.getsourcelines(CUBE_OFF.backward)[1]
    assert first.startswith(f"custom autograd.Function Fn ({__file__}:{line}): its backward disagrees with the "
                            "derivative of its forward")
    assert ": x: " in first  # the input whose gradient is wrong, named as forward names it


def test_a_torch_only_failure_names_torchs_check():
    with pytest.raises(GradcheckError, match=r"^Fn.apply \(.*\): torch's gradcheck reentrancy check \(nondet_tol\) "
                                             r"failed \(gradcheck: PASS\): Backward is not reentrant"):
        gradcheck(NOISY.apply, (x3(),))
    with pytest.raises(GradcheckError, match="^Fn.apply .*torch's gradcheck check_batched_grad failed"):
        gradcheck(UNBATCHABLE.apply, (x3(),), check_batched_grad=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def test_the_drop_in_on_a_server_keeps_torchs_outcome(server):
    assert gradcheck(CUBE.apply, (x3(),), server=server.target) is True
    with pytest.raises(tg.GradcheckError, match=r"^custom autograd.Function Fn \(.*\): its backward disagrees"):
        gradcheck(CUBE_OFF.apply, (x3(),), server=server.target)
    with pytest.raises(GradcheckError, match="torch's gradcheck reentrancy check"):  # torch's checks: here
        gradcheck(NOISY.apply, (x3(),), server=server.target)


def test_the_signatures_are_torchs():
    for ours, theirs in ((gradcheck, torch.autograd.gradcheck), (gradgradcheck, torch.autograd.gradgradcheck)):
        mine = inspect.signature(ours).parameters
        assert [(p.name, p.default, p.kind) for p in inspect.signature(theirs).parameters.values()] == \
            [(p.name, p.default, p.kind) for p in mine.values() if p.name != "server"]
    with pytest.raises(TypeError, match="fast_mod"):
        gradcheck(torch.tanh, (x3(),), fast_mod=True)  # an unknown option is never accepted


# ---- planted-bug twins ----

class Masked(torch.autograd.Function):
    """x * mask: the mask is a float tensor that does not require grad, a constant; None is its gradient."""
    @staticmethod
    def forward(ctx, x, mask):
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, g):
        mask, = ctx.saved_tensors
        return g * mask, None


class MaskedWrong(Masked):
    @staticmethod
    def backward(ctx, g):
        mask, = ctx.saved_tensors
        return g, None  # the mask forgotten


class GradReverse(torch.autograd.Function):
    """A domain-adaptation gradient reversal: identity forward, -alpha g backward (alpha a float tensor)."""
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(alpha)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        alpha, = ctx.saved_tensors
        return -alpha * g, None


@surrogate("gradient reversal: the backward is -alpha times the identity's")
class DeclaredGradReverse(GradReverse):
    pass


class RoundSTE(torch.autograd.Function):
    """round(x) forward, the identity's gradient backward: a straight-through estimator."""
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class DeclaredRoundSTE(RoundSTE):
    gradcheck_surrogate = "straight-through estimator"  # the attribute form: no import in the model's code


def test_a_non_differentiable_float_argument_is_a_constant_not_an_input():
    mask = torch.tensor([1.0, 0.0, 1.0], dtype=D)
    assert torch.autograd.gradcheck(lambda x: Masked.apply(x, mask).sin(), (x3(),)) is True
    assert gradcheck(lambda x: Masked.apply(x, mask).sin(), (x3(),)) is True
    assert gradcheck(Masked.apply, (x3(), mask)) is True
    with pytest.raises(GradcheckError, match=r"^custom autograd.Function MaskedWrong \(.*\): its backward "
                                             r"disagrees .*'x'"):
        gradcheck(lambda x: MaskedWrong.apply(x, mask).sin(), (x3(),))


def test_gradient_reversal_is_checked_not_crashed_and_declared_it_is_a_surrogate():
    alpha = torch.tensor(0.5, dtype=D)
    with pytest.raises(GradcheckError, match=r"^custom autograd.Function GradReverse \(.*\): its backward "
                                             r"disagrees with the derivative of its forward"):
        gradcheck(lambda x: GradReverse.apply(x, alpha).sin(), (x3(),))
    with pytest.warns(UserWarning, match=r"DeclaredGradReverse \(.*\): declared surrogate \(gradient reversal"):
        assert gradcheck(lambda x: DeclaredGradReverse.apply(x, alpha).sin(), (x3(),)) is True


def test_a_declared_straight_through_estimator_is_reported_and_the_rest_still_checked():
    from gradcheck_client.torch import check

    with pytest.raises(tg.GradcheckError):  # torch: the Jacobian of round is 0 almost everywhere
        torch.autograd.gradcheck(lambda x: torch.sin(RoundSTE.apply(x)) * x, (x3(),))
    with pytest.raises(GradcheckError, match="RoundSTE"):  # undeclared, it still fails
        gradcheck(lambda x: torch.sin(RoundSTE.apply(x)) * x, (x3(),))
    report = check(lambda x: (torch.sin(DeclaredRoundSTE.apply(x)) * x).sum(), x3(grad=False))
    [entry] = report.data["opaque"]
    assert report.verdict == "pass" and entry["verdict"] == "surrogate"
    assert entry["detail"] == "declared surrogate (straight-through estimator), not checked against the derivative"
    assert "DeclaredRoundSTE" in report.text and "SURROGATE: declared surrogate" in report.text
    # the rest of the graph is still checked: a hook doubling the gradient after the surrogate fails

    def doubled(x):
        h = torch.sin(DeclaredRoundSTE.apply(x))
        h.register_hook(lambda g: g * 2)
        return (h * x).sum()
    assert check(doubled, x3(grad=False)).verdict == "fail"
    # and a cut of torch's graph elsewhere (.item()), which the waived values screen cannot decide, is no pass:
    # torch's gradcheck fails it (the drop-in returned True)
    with pytest.raises(GradcheckError, match=r"^the function's values: UNDECIDED: torch's graph was cut at \.item\(\)"):
        gradcheck(lambda x: torch.sin(DeclaredRoundSTE.apply(x)) * x * x.sum().item(), (x3(),))


class Mul(torch.autograd.Function):
    """x * y with ctx.needs_input_grad read: right, and a twin that reads the other input's flag."""
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return (g * y if ctx.needs_input_grad[0] else None), (g * x if ctx.needs_input_grad[1] else None)


class MulWrongFlags(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return (g * y if ctx.needs_input_grad[1] else None), (g * x if ctx.needs_input_grad[0] else None)


def test_a_wrong_needs_input_grad_is_caught_naming_the_function_and_the_input():
    y = x3(0.5, 2.0, -1.5, grad=False)
    assert gradcheck(Mul.apply, (x3(), y)) is True
    with pytest.raises(tg.GradcheckError):
        torch.autograd.gradcheck(MulWrongFlags.apply, (x3(), y))
    line = inspect.getsourcelines(MulWrongFlags.backward)[1]
    with pytest.raises(GradcheckError, match=rf"^custom autograd.Function MulWrongFlags \(.*:{line}\): .*'x'"):
        gradcheck(MulWrongFlags.apply, (x3(), y))


def test_my_fn_apply_is_named_by_class_file_and_line():
    line = inspect.getsourcelines(CUBE_OFF.backward)[1]
    with pytest.raises(GradcheckError, match=rf"^custom autograd.Function Fn \({__file__}:{line}\): its backward"):
        gradcheck(CUBE_OFF.apply, (x3(),), raise_exception=True)
    with pytest.raises(GradcheckError, match=rf"^Fn.apply \({__file__}:{line}\): torch's gradcheck"):  # torch's only
        gradcheck(NOT_BY_G.apply, (x3(),))
    assert gradcheck(CUBE.apply, (x3(),)) is True


class CubeLayer(torch.nn.Module):
    def forward(self, x):
        return CUBE_OFF.apply(x)


def test_a_function_inside_a_module_is_named_by_module_path():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), CubeLayer()).to(D)
    with pytest.raises(tg.GradcheckError):
        torch.autograd.gradcheck(model, (x3(),))
    with pytest.raises(GradcheckError, match=r"^custom autograd.Function Fn in module 1 \(CubeLayer\) \("):
        gradcheck(model, (x3(),))


@torch.library.custom_op("gradcheck_peer::wavy_wrong", mutates_args=())
def wavy_wrong(x: torch.Tensor) -> torch.Tensor:
    return x * 3.0 + torch.sin(x)


torch.library.register_autograd(
    "gradcheck_peer::wavy_wrong", lambda ctx, g: g * (3.0 + torch.cos(ctx.saved_tensors[0])) * 1.01,
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def test_a_torch_library_op_is_named():
    with pytest.raises(tg.GradcheckError):
        torch.autograd.gradcheck(wavy_wrong, (x3(),))
    with pytest.raises(GradcheckError, match=r"^opaque torch op gradcheck_peer::wavy_wrong \(.*\): FAIL: .*input 0"):
        gradcheck(wavy_wrong, (x3(),))


# ---- gradgradcheck ----

class DetachedSquare(torch.autograd.Function):
    """x**2 whose backward reads x detached: the first derivative right, the second one lost (zero)."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2 * x.detach()


class Square(DetachedSquare):
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 2 * x


def test_gradgradcheck_catches_a_wrong_double_backward_as_torch_does():
    assert gradcheck(DetachedSquare.apply, (x3(),)) is True  # first order: right
    assert torch.autograd.gradgradcheck(Square.apply, (x3(),)) is True
    assert gradgradcheck(Square.apply, (x3(),)) is True
    with pytest.raises(tg.GradcheckError):
        torch.autograd.gradgradcheck(DetachedSquare.apply, (x3(),))
    with pytest.raises(GradcheckError, match=r"^the gradient of DetachedSquare.apply \(.*\): "):
        gradgradcheck(DetachedSquare.apply, (x3(),))
    assert gradgradcheck(DetachedSquare.apply, (x3(),), raise_exception=False) is False
    with pytest.raises(AssertionError, match="check_fwd_over_rev or check_rev_over_rev"):
        gradgradcheck(Square.apply, (x3(),), check_rev_over_rev=False)


def doubling(factor):
    """2 x as a Function whose backward is g * factor (right: 2): the derivative a double backward uses."""
    class Doubling(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * factor
    return Doubling


def square_through(inner):
    """x**2 whose backward is a Function call, g * inner(x): its double backward is inner's backward."""
    class SquareThrough(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * inner.apply(x)
    return SquareThrough


def test_gradgradcheck_names_the_function_whose_backward_the_double_backward_runs():
    right, wrong = square_through(doubling(2.0)), square_through(doubling(2.02))
    assert gradcheck(wrong.apply, (x3(),)) is True  # first order: right
    assert gradgradcheck(right.apply, (x3(),)) is True
    with pytest.raises(tg.GradcheckError):
        torch.autograd.gradgradcheck(wrong.apply, (x3(),))
    with pytest.raises(GradcheckError, match=r"^the gradient of SquareThrough.apply \(.*\): custom autograd.Function "
                                             r"Doubling \(.*\): its backward disagrees"):
        gradgradcheck(wrong.apply, (x3(),))


def written_through_a_view(x):
    y = x * 1.0
    y[:2].mul_(3.0)
    return y.exp()


def test_an_op_of_a_backward_pass_that_cannot_be_captured_is_named_as_one():
    """An in-place write through a view: its backward (CopySlices) writes into a new_empty_strided, which the
    capture refuses -- the op named as one of a backward pass, not as if the user's line made it."""
    assert torch.autograd.gradgradcheck(written_through_a_view, (x3(),)) is True
    with pytest.raises(GradcheckError, match=r"^not checked: an output of opaque torch op aten::new_empty_strided "
                                             r"\(in a backward pass, .*test_torch_peer_scenarios.py:\d+\) is written"):
        gradgradcheck(written_through_a_view, (x3(),))


def test_a_complex_or_sparse_case_says_that_torchs_check_alone_decided_it():
    with pytest.warns(UserWarning, match=r"complex input 0 \(torch's Wirtinger convention\): checked by torch's "
                                         r"own gradcheck only"):
        assert gradcheck(lambda z: (z * z).abs(), (z2(),)) is True
    with pytest.warns(UserWarning, match="input 0 of layout torch.sparse_coo"):
        assert gradcheck(lambda s: torch.sin(s.to_dense()), (_sparse(),), masked=True) is True


def test_a_complex_intermediate_is_decided_by_torchs_checks_alone_never_laxer():
    """A complex tensor made from real traced values (not captured, check() refuses it): torch's outcome, with
    the warning naming the op and the line -- a correct function True, a backward 1% off torch's failure."""
    def spectrum(x):
        return torch.fft.rfft(x).abs().sum()

    def spectrum_of_wrong(x):
        return torch.fft.rfft(function(lambda x: x * 2, lambda x, g: g * 2.02).apply(x)).abs().sum()
    assert torch.autograd.gradcheck(spectrum, (x3(),)) is True
    with pytest.warns(UserWarning, match=r"torch op aten::_fft_r2c made a torch.complex128 tensor from traced values "
                                         r"\(at .*test_torch_peer_scenarios.py:\d+\): complex intermediates are "
                                         r"not captured: checked by torch's own gradcheck only"):
        assert gradcheck(spectrum, (x3(),)) is True
    with pytest.raises(tg.GradcheckError, match="Jacobian mismatch"):
        torch.autograd.gradcheck(spectrum_of_wrong, (x3(),))
    with pytest.warns(UserWarning, match="complex intermediates are not captured"), \
            pytest.raises(GradcheckError, match=r"^torch's gradcheck Jacobian check failed: Jacobian mismatch"):
        gradcheck(spectrum_of_wrong, (x3(),))


class SavedStatistics(torch.autograd.Function):
    """Standardization saving its mean and 1/std for the backward, which reads them as constants: the first
    derivative right, the double backward missing their dependence on x."""
    @staticmethod
    def forward(ctx, x):
        mean, rstd = x.mean(), (x.var(unbiased=False) + 1e-5).rsqrt()
        ctx.save_for_backward(x, mean, rstd)
        return (x - mean) * rstd

    @staticmethod
    def backward(ctx, g):
        x, mean, rstd = ctx.saved_tensors
        xhat = (x - mean) * rstd
        return rstd * (g - g.mean() - xhat * (g * xhat).mean())


class GivenStatistics(torch.autograd.Function):
    """(x - mean) * rstd with the statistics computed by the caller (differentiably) and saved: the double
    backward runs through the saved mean and rstd into x."""
    @staticmethod
    def forward(ctx, x, mean, rstd):
        ctx.save_for_backward(x, mean, rstd)
        return (x - mean) * rstd

    @staticmethod
    def backward(ctx, g):
        x, mean, rstd = ctx.saved_tensors
        return g * rstd, -(g * rstd).sum(), (g * (x - mean)).sum()


def standardized(x):
    return GivenStatistics.apply(x, x.mean(), (x.var(unbiased=False) + 1e-5).rsqrt())


def sine_of_a_tensor_then_written(x):
    """sin saves its input u, which is written in place afterwards: autograd's version check refuses the
    backward (gradgradcheck's saved-tensor hooks must keep that check, not differentiate the new value)."""
    u = x * 1
    y = u.sin()
    u.add_(1)
    return y


GRADGRAD = [
    ("saved statistics read as constants by the backward", SavedStatistics.apply, lambda: (x3(0.3, -0.7, 1.1, 0.4),),
     {}, tg.GradcheckError, GradcheckError),
    ("saved statistics computed by the caller", standardized, lambda: (x3(0.3, -0.7, 1.1, 0.4),), {}, True, True),
    ("tanh (saves its output)", torch.tanh, lambda: (x3(),), {}, True, True),
    ("given grad_outputs", torch.sigmoid, lambda: (x3(),),
     {"grad_outputs": (torch.tensor([0.5, -1.0, 2.0], dtype=D, requires_grad=True),)}, True, True),
    ("forward over reverse", torch.sin, lambda: (x3(),), {"check_fwd_over_rev": True}, True, True),
    ("two inputs", lambda a, b: a * b.exp(), lambda: (x3(), x3(0.1, 0.2, 0.3)), {}, True, True),
    ("a detach in the backward", DetachedSquare.apply, lambda: (x3(),), {}, tg.GradcheckError, GradcheckError),
    ("raise_exception=False", DetachedSquare.apply, lambda: (x3(),), {"raise_exception": False}, False, False),
    ("both modes off", torch.sin, lambda: (x3(),), {"check_rev_over_rev": False, "check_undefined_grad": False},
     AssertionError, AssertionError),
    ("a saved tensor written in place after the forward", sine_of_a_tensor_then_written, lambda: (x3(),), {},
     RuntimeError, RuntimeError),
    # torch.func refuses saved-tensor hooks: torch's checks run without ours (no RuntimeError), our capture refuses
    ("torch.func.grad inside the function", lambda x: torch.func.grad(lambda t: t.sin().sum())(x), lambda: (x3(),),
     {}, True, GradcheckError),
    # layer_norm's backward reads its saved mean: the capture refuses it -- stricter, never a pass
    ("refused: a backward reading a saved statistic", lambda x: torch.nn.functional.layer_norm(x, (3,)),
     lambda: (x3(),), {}, True, GradcheckError),
]


@pytest.mark.parametrize("name, fn, inputs, keywords, torch_outcome, our_outcome", GRADGRAD,
                         ids=[s[0] for s in GRADGRAD])
def test_gradgradcheck_gives_torchs_outcome_or_a_stricter_one(name, fn, inputs, keywords, torch_outcome,
                                                                 our_outcome):
    theirs = outcome(torch.autograd.gradgradcheck, fn, inputs(), keywords)
    ours = outcome(gradgradcheck, fn, inputs(), keywords)
    assert kind(theirs) is torch_outcome, f"torch: {theirs!r}"
    assert kind(ours) is our_outcome, f"ours: {ours!r}"
    assert same_or_stricter(theirs, ours)


def test_index_put_on_a_view_and_grouped_query_attention_are_captured_not_opaque():
    """The scenarios above pass on the captured graph itself (the references differentiate the replayed
    index_put and the heads k and v lend to q), not on an opaque node checked by differences."""
    for fn, inputs in ((INDEX_PUT, rows()), (GroupedQueryAttention(), qkv())):
        report = check(fn, *inputs)
        assert report.verdict == "pass" and report.data["opaque"] == [], report.text
