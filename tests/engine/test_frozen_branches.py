"""Frozen branches (oracles/finite_diff.py, OpDef.select / frozen): the perturbed forwards evaluate each
piecewise op on the piece the unperturbed forward took, so finite differences never straddle a kink.

- next to kinks (inputs within one step of them), the frozen differences equal the analytic derivative
  (torch autograd) where ordinary ones straddle and miss it;
- each op's frozen piece is its forward wherever the piece holds (registry-wide, batched too), and every
  op with a declared kink is frozen or listed;
- they cannot hide a bug: every piecewise op's planted wrong rule (its vjp scaled, or a wrong piece) is
  still found and named at its node (relu, leaky_relu, abs, clip, maximum, minimum, max, min, max_pool,
  where behind a held comparison), in float64 and float32, with its inputs crowded next to the kink;
- a convention that differs from the declared one at an exact tie stays a kink finding, never a FAIL;
- a max-pool with exact ties (windows of ReLU zeros) passes, with a kink note, under every --fd mode;
- the joint screen of a ReLU CNN with many near-kink inputs takes its 2k whole-graph evaluations and no
  more (ordinary differences flag it and re-evaluate directions).
The registry has no sort / top-k op; every op that selects (max, max_pool, maximum, clip, where through
its comparison) is covered here.
"""
import dataclasses

import numpy as np
import pytest

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, backward, forward, frozen_step, prepare_feeds
from gradcheck_svc.engine.executor import run_step_batched
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.ops import all_ops
from gradcheck_svc.ops.registry import REGISTRY, register
from gradcheck_svc.oracles.fd_plan import MIN_DIRECTIONS
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.verify import VerifyOptions, verify
from gradcheck_svc.verify.compare import Tolerance
from gradcheck_svc.verify.joint_check import joint_screen

NEAR = 1e-7  # well inside the first pass's step (cbrt(eps) ~ 6e-6): ordinary differences straddle


def _near(rng, shape, at=0.0, gap=NEAR):
    """Inputs within `gap` of a kink at `at`, both sides, none exactly on it."""
    return at + rng.uniform(0.2, 1.0, size=shape) * gap * rng.choice([-1.0, 1.0], size=shape)


def _graph(op, inputs: dict, rng, attrs, node_op=None):
    """loss = sum(node_op(*inputs) * r), every output element weighed differently (node_op: a planted copy
    of op, else op itself); inputs: name -> (value, requires_grad)."""
    b = GraphBuilder(op)
    names = [b.input(n, v, requires_grad=g) for n, (v, g) in inputs.items()]
    y = b.node(node_op or op, *names, name="y", **attrs)
    shape = _shape(op, inputs, attrs)
    b.output(b.node("sum", b.node("mul", y, b.input("r", rng.uniform(0.5, 1.5, size=shape)), name="yr"), name="L"))
    return load_graph(b.build())


def _shape(op, inputs, attrs):
    import torch

    vals = [torch.tensor(v) for v, _ in inputs.values()]
    return tuple(_torch_ops()[op](*vals, **attrs).shape)


def _torch_ops() -> dict:
    """Each kinked op as torch computes it (torch imported when a test needs it: collection stays cheap)."""
    import torch

    return {
        "relu": lambda x: torch.relu(x),
        "leaky_relu": lambda x, negative_slope=0.01: torch.nn.functional.leaky_relu(x, negative_slope),
        "abs": torch.abs,
        "clip": lambda x, min=None, max=None: torch.clamp(x, min, max),
        "maximum": torch.maximum,
        "minimum": torch.minimum,
        "max": lambda x, axis=None, keepdims=False: torch.amax(x, dim=axis, keepdim=keepdims),
        "min": lambda x, axis=None, keepdims=False: torch.amin(x, dim=axis, keepdim=keepdims),
        "max_pool": lambda x, kernel_shape, strides=None: torch.nn.functional.max_pool2d(x, kernel_shape, strides),
    }


def _cases(rng, gap=NEAR):
    """(op, inputs, attrs): every case has elements within `gap` of its kink."""
    pair = _near(rng, (3, 4), gap=gap)
    a = rng.uniform(-1, 1, size=(3, 4))
    windows = rng.uniform(-1, 1, size=(1, 2, 4, 4))
    windows[..., ::2, ::2] = rng.uniform(1.5, 2.0, size=(1, 2, 2, 2))
    windows[..., 1::2, 1::2] = windows[..., ::2, ::2] + _near(rng, (1, 2, 2, 2), gap=gap)  # near-tied maxima everywhere
    grouped = rng.uniform(-1, 1, size=(3, 4))
    grouped[:, 1] = grouped[:, 0] + _near(rng, 3, gap=gap)
    grouped[:, 0] = np.maximum(grouped[:, 0], grouped[:, 2:].max(axis=1) + 0.5)  # the near-tie is the max
    grouped[:, 1] = grouped[:, 0] + _near(rng, 3, gap=gap)
    return [
        ("relu", {"x": (_near(rng, (3, 4), gap=gap), True)}, {}),
        ("leaky_relu", {"x": (_near(rng, (3, 4), gap=gap), True)}, {"negative_slope": 0.1}),
        ("abs", {"x": (_near(rng, (3, 4), gap=gap), True)}, {}),
        ("clip", {"x": (_near(rng, (3, 4), at=0.5, gap=gap), True)}, {"min": -0.5, "max": 0.5}),
        ("maximum", {"a": (a, True), "b": (a + pair, True)}, {}),
        ("minimum", {"a": (a, True), "b": (a + pair, True)}, {}),
        ("max", {"x": (grouped, True)}, {"axis": 1}),
        ("min", {"x": (-grouped, True)}, {"axis": 1}),
        ("max_pool", {"x": (windows, True)}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ]


def _torch_grad(op, inputs, attrs, r):
    import torch

    ts = [torch.tensor(v, requires_grad=g) for v, g in inputs.values()]
    (_torch_ops()[op](*ts, **attrs) * torch.tensor(r)).sum().backward()
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("k", range(9), ids=lambda k: _cases(np.random.default_rng(0))[k][0])
def test_frozen_differences_equal_the_derivative_where_ordinary_ones_straddle(k):
    rng = np.random.default_rng(1)
    op, inputs, attrs = _cases(rng)[k]
    graph = _graph(op, inputs, rng, attrs)
    r = graph.inputs["r"].value
    want = dict(zip(inputs, _torch_grad(op, inputs, attrs, r)))
    frozen = FiniteDifferences(graph, FDOptions(mode="full"))
    ordinary = FiniteDifferences(graph, FDOptions(mode="full", frozen_branches=False))
    assert "y" in frozen.frozen
    for name in inputs:
        np.testing.assert_allclose(frozen.gradient(name).reference, want[name], rtol=1e-8, atol=1e-8)
        assert np.max(np.abs(ordinary.gradient(name).reference - want[name])) > 0.05  # the kink is straddled


def test_held_comparisons_freeze_where_s_branch():
    """where(x > 0, x, 0.1 x): the comparison's mask is held at its unperturbed value (a piecewise
    constant output), so `where` keeps each element's branch."""
    rng = np.random.default_rng(2)
    x = _near(rng, (12,))
    b = GraphBuilder("where")
    b.input("x", x, requires_grad=True)
    m = b.node("greater", "x", b.input("zero", 0.0), name="m")
    y = b.node("where", m, "x", b.node("mul", "x", b.input("s", 0.1), name="xs"), name="y")
    b.output(b.node("sum", b.node("mul", y, b.input("r", rng.uniform(0.5, 1.5, 12)), name="yr"), name="L"))
    graph = load_graph(b.build())
    r = graph.inputs["r"].value
    fd = FiniteDifferences(graph, FDOptions(mode="full"))
    np.testing.assert_allclose(fd.gradient("x").reference, r * np.where(x > 0, 1.0, 0.1), rtol=1e-8)


FROZEN = [op for op in all_ops() if op.select is not None]


def test_every_kinked_op_is_frozen_or_listed():
    """A new piecewise op gets its frozen piece or a reason here: these still straddle their kinks (the
    kink analysis's one-sided differences decide there)."""
    straddling = {op.name for op in all_ops() if op.kinks and op.select is None and not op.held}
    # pow: its kink is a domain edge (a ** b at a == 0), not a choice of piece; grid_sample: its pieces are
    # chosen by its corners input (grid_sample_corners, held: a constant of the differences), so a difference
    # never crosses one -- its kinks are declared for the kink notes; norm: a cone's tip (a slice all zeros)
    # has no piece to freeze, and central differences straddle it symmetrically (|h| - |-h| = 0, its convention)
    assert straddling == {"pow", "grid_sample", "norm"}
    assert {"relu", "leaky_relu", "abs", "clip", "maximum", "minimum", "max", "min", "max_pool"} <= \
        {op.name for op in FROZEN}


@pytest.mark.parametrize("op", FROZEN, ids=lambda o: o.name)
def test_the_frozen_piece_is_the_forward_where_the_piece_holds(op):
    """frozen(select(x), x) is forward(x) bit for bit on the registry's points, unbatched and on a stack of
    small perturbations that keep every piece (the points keep off the kinks)."""
    rng = np.random.default_rng(7)
    for case in op.cases(rng):
        graph = load_graph(_case_graph(op, case))
        step = Program(graph, np.float64).by_name["y"]
        xs = [np.asarray(graph.inputs[n].value) for n in step.inputs]
        piece = step.op.select(np, *xs, **step.attrs)
        assert np.array_equal(step.op.frozen(np, piece, *xs, **step.attrs), step.op.forward(np, *xs, **step.attrs))
        stack = [np.stack([x + 1e-9 * rng.standard_normal(x.shape) for _ in range(3)]) if x.dtype.kind == "f" else x
                 for x in xs]
        batched = [x.dtype.kind == "f" for x in xs]
        want = run_step_batched(np, step, stack, batched)
        np.testing.assert_array_equal(frozen_step(np, step, piece, stack, batched), want)


def _case_graph(op, case):
    b = GraphBuilder(op.name)
    names = [b.input(f"in{i}", np.asarray(x), requires_grad=np.asarray(x).dtype.kind == "f")
             for i, x in enumerate(case.inputs)]
    b.output(b.node("sum", b.node(op.name, *names, name="y", **case.attrs), name="L"))
    return b.build()


# -- no bug hides: planted wrong rules next to kinks --------------------------------------------------


def _planted(op, vjp, name):
    bad = dataclasses.replace(op, name=name, vjp=vjp)
    register(bad)
    return bad


def _scaled(op):
    return lambda xp, g, saved, **a: tuple(None if v is None else 1.5 * v for v in op.vjp(xp, g, saved, **a))


def _wrong_piece(op_name):
    """A rule that takes the wrong piece next to the kink (the bug a straddled difference could excuse)."""
    return {
        "relu": lambda xp, g, s: (g * (s[0] >= 0),),  # 1 on the flat piece too
        # the right piece only beyond a band around the kink (every near-kink input lies in it)
        "leaky_relu": lambda xp, g, s, negative_slope=0.01: (g * xp.where(s[0] > -1e-3, 1.0, negative_slope),),
        "abs": lambda xp, g, s: (g * xp.where(xp.abs(s[0]) < 1e-3, 1.0, xp.sign(s[0])),),
        "clip": lambda xp, g, s, min=None, max=None: (g * 1.0 + 0 * s[0],),  # ignores the bounds
    }.get(op_name)


PLANTS = [(k, kind) for k in range(9) for kind in ("scaled", "piece")
          if kind == "scaled" or _wrong_piece(_cases(np.random.default_rng(0))[k][0]) is not None]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("k,kind", PLANTS, ids=lambda v: str(v))
def test_a_piecewise_op_s_wrong_rule_is_found_at_its_node(k, kind, dtype):
    rng = np.random.default_rng(3)
    # float32: near the kink, yet beyond float32's rounding (classify.FLIP_BAND), where a float32 forward
    # may take another piece than the frozen float64 one and the kink analysis decides
    op_name, inputs, attrs = _cases(rng, NEAR if dtype == "float64" else 1e3 * NEAR)[k]
    op = REGISTRY[op_name]
    bad = _planted(op, _scaled(op) if kind == "scaled" else _wrong_piece(op_name), f"{op_name}_bad")
    try:
        report = verify(_graph(op_name, inputs, rng, attrs, bad.name), VerifyOptions(dtype=dtype))
    finally:
        del REGISTRY[bad.name]
    assert report.verdict == "fail", report.to_text()
    errors = [(f.node, f.cause) for f in report.findings if f.severity == "error"]
    assert errors == [("y", "rule_error")], report.to_text()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_wrong_where_rule_behind_a_held_comparison_is_found_at_its_node(dtype):
    """where(x > 0, x, 0.1 x) with every x next to 0: the comparison is held, `where` keeps its branches,
    and its planted wrong rule (scaled) is a rule_error at its node."""
    where = REGISTRY["where"]
    bad = _planted(where, _scaled(where), "where_bad")
    rng = np.random.default_rng(8)
    x = _near(rng, (12,)) * (1e3 if dtype == "float32" else 1.0)
    b = GraphBuilder("where_near")
    b.input("x", x, requires_grad=True)
    m = b.node("greater", "x", b.input("zero", 0.0), name="m")
    y = b.node(bad.name, m, "x", b.node("mul", "x", b.input("s", 0.1), name="xs"), name="y")
    b.output(b.node("sum", b.node("mul", y, b.input("r", rng.uniform(0.5, 1.5, 12)), name="yr"), name="L"))
    try:
        report = verify(load_graph(b.build()), VerifyOptions(dtype=dtype))
    finally:
        del REGISTRY[bad.name]
    assert report.verdict == "fail", report.to_text()
    assert [(f.node, f.cause) for f in report.findings if f.severity == "error"] == [("y", "rule_error")], \
        report.to_text()


# -- exact ties: a convention is a note --------------------------------------------------------------


def test_a_different_convention_at_an_exact_kink_is_a_kink_finding_not_a_fail():
    """relu'(0) = 1 instead of the declared 0 (the saved input tells x == 0): the frozen differences take
    the declared piece and disagree, and the diagnosis names the kink, whose one-sided differences hold
    the engine's value: a warning, not a failure."""
    relu = REGISTRY["relu"]
    bad = _planted(dataclasses.replace(relu, save=lambda xs, y, **_: (xs[0],)),
                   lambda xp, g, s: (g * (s[0] >= 0),), "relu_at_zero_one")
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, size=(3, 4))
    x[0, :2] = 0.0
    try:
        for dtype in ("float64", "float32"):
            report = verify(_graph("relu", {"x": (x, True)}, rng, {}, bad.name), VerifyOptions(dtype=dtype))
            assert report.verdict == "pass", report.to_text()
            assert [(f.node, f.cause, f.severity) for f in report.findings] == \
                [("y", "nondifferentiable_point", "warning")], report.to_text()
            assert "exactly at its kink" in report.findings[0].detail
            (row,) = report.parameters  # the differences saw the other convention; the kink explains it
            assert not row.fd.passed and row.status == "ok (kink)", report.to_text()
    finally:
        del REGISTRY[bad.name]


def _pool_graph(rng, pool="max_pool"):
    """relu -> max_pool: windows all ReLU zeros (exact ties at 0) and windows with two equal maxima."""
    x = rng.uniform(0.1, 1.0, size=(1, 2, 4, 6))
    x[0, 0, :2, :2] = -rng.uniform(0.1, 1.0, size=(2, 2))  # a window of zeros after the relu
    x[0, 1, 2:, 2:4] = -rng.uniform(0.1, 1.0, size=(2, 2))
    x[0, 0, 2, 4] = x[0, 0, 3, 5] = 2.0  # two equal maxima
    x[0, 1, 0, 0] = x[0, 1, 1, 1] = 1.5
    b = GraphBuilder("relu_pool_ties")
    b.input("x", x, requires_grad=True)
    h = b.node("relu", "x", name="h")
    y = b.node(pool, h, name="y", kernel_shape=[2, 2], strides=[2, 2])
    b.output(b.node("sum", b.node("mul", y, b.input("r", rng.uniform(0.5, 1.5, size=(1, 2, 2, 3))), name="yr"),
                    name="L"))
    return load_graph(b.build())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["auto", "joint", "full", "projection"])
def test_max_pool_ties_of_relu_zeros_pass_with_a_note_under_every_mode(mode, dtype):
    graph = _pool_graph(np.random.default_rng(5))
    report = verify(graph, VerifyOptions(dtype=dtype, fd=FDOptions(mode=mode)))
    assert report.verdict == "pass", report.to_text()
    assert [(f.node, f.cause) for f in report.findings] == [("y", "nondifferentiable_point")], report.to_text()
    (note,) = report.findings
    assert note.severity in ("info", "warning") and "not a failure" in note.detail
    assert "exactly at its kink ties for a window's maximum" in note.detail, report.to_text()
    # kink proximity: the tied windows counted, and what the differences did there
    assert "4 elements within a finite-difference step of it" in note.detail and "frozen branches" in note.detail


def test_max_pool_with_another_tie_convention_is_a_kink_finding_not_a_fail():
    """A max_pool whose vjp gives a tied window's gradient to its last maximum, not the declared first: the
    frozen differences take the first and disagree at the tied windows; the kink analysis's one-sided
    differences hold the engine's value there -- a warning, not a failure, in float64 and float32."""
    from gradcheck_svc.ops.pool import _flat_windows
    from gradcheck_svc.ops.windows import crop_spatial, windows_adjoint

    def last_max(xp, g, saved, geo):
        flat = _flat_windows(xp, saved[0], geo, -np.inf)
        last = flat.shape[-1] - 1 - xp.argmax(flat[..., ::-1], axis=-1)
        dflat = (xp.arange(flat.shape[-1]) == last[..., None]) * g[..., None]
        return (crop_spatial(windows_adjoint(xp, dflat.reshape(dflat.shape[:-1] + geo.kernel), geo), geo),)
    bad = _planted(REGISTRY["max_pool"], last_max, "max_pool_last")
    try:
        for dtype in ("float64", "float32"):
            report = verify(_pool_graph(np.random.default_rng(5), bad.name), VerifyOptions(dtype=dtype))
            assert report.verdict == "pass", report.to_text()
            (row,) = report.parameters  # the differences saw the other convention; the kink explains it
            assert not row.fd.passed and row.status == "ok (kink)", report.to_text()
            assert [(f.node, f.cause, f.severity) for f in report.findings] == \
                [("y", "nondifferentiable_point", "warning")], report.to_text()
    finally:
        del REGISTRY[bad.name]


# -- the joint screen's cost next to kinks -------------------------------------------------------------


def _near_kink_cnn(rng):
    """conv -> relu -> max_pool -> relu, its pre-activations shifted to within NEAR of 0 (most ReLU inputs
    and pooling windows sit within a step of their kinks)."""
    import torch

    x = rng.uniform(-1, 1, size=(2, 2, 6, 6))
    w = rng.uniform(-0.5, 0.5, size=(4, 2, 3, 3))
    conv = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
    b = GraphBuilder("near_kink_cnn")
    b.input("x", x)
    b.input("w", w, requires_grad=True)
    z = b.node("sub", b.node("conv", "x", "w", name="c", pads=[1, 1, 1, 1]),
               b.input("shift", conv - _near(rng, conv.shape)), name="z")
    p = b.node("max_pool", b.node("relu", z, name="h"), name="p", kernel_shape=[2, 2], strides=[2, 2])
    q = b.node("relu", b.node("sub", p, b.input("s2", 0.5 * NEAR), name="ps"), name="q")
    b.output(b.node("sum", b.node("mul", q, b.input("r", rng.uniform(0.5, 1.5, size=(2, 4, 3, 3))), name="qr"),
                    name="L"))
    return load_graph(b.build())


def joint_evaluations(graph, frozen: bool) -> tuple[int, list]:
    """(whole-graph evaluations of the joint screen, the parameters it flagged)."""
    program = Program(graph, np.float64)
    grads = {k: np.asarray(v) for k, v in backward(forward(program, NUMPY, prepare_feeds(program, NUMPY))).items()}
    fd = FiniteDifferences(graph, FDOptions(mode="joint", frozen_branches=frozen))
    screen = joint_screen(fd, grads, list(graph.parameters), Tolerance.for_dtype("float64"))
    return screen.evaluations, screen.flagged


def test_the_joint_screen_next_to_kinks_costs_its_k_evaluations():
    graph = _near_kink_cnn(np.random.default_rng(6))
    after, flagged = joint_evaluations(graph, frozen=True)  # complex steps: one forward per direction
    assert (after, flagged) == (MIN_DIRECTIONS, [])  # as many as their power chooses (joint_check.joint_k)
    before, _ = joint_evaluations(graph, frozen=False)  # central differences (complex steps need frozen branches)
    assert before > 2 * after  # ordinary differences straddle the kinks and the screen re-evaluates
    assert verify(graph, VerifyOptions(fd=FDOptions(mode="joint"))).verdict == "pass"


def test_full_differences_of_a_near_kink_cnn_equal_torch_s_gradient():
    """The conv weight's one-element copies travel as slices (one output channel each) through the frozen
    relu and max_pool (slices.independent_frozen): the differences are torch autograd's gradient, though
    most ReLU inputs and pooling windows sit within a step of their kinks."""
    import torch

    graph = _near_kink_cnn(np.random.default_rng(6))
    v = {n: torch.tensor(np.asarray(i.value)) for n, i in graph.inputs.items()}
    w = v["w"].clone().requires_grad_(True)
    z = torch.nn.functional.conv2d(v["x"], w, padding=1) - v["shift"]
    q = torch.relu(torch.nn.functional.max_pool2d(torch.relu(z), 2, 2) - v["s2"])
    (q * v["r"]).sum().backward()
    frozen = FiniteDifferences(graph, FDOptions(mode="full"))
    np.testing.assert_allclose(frozen.gradient("w").reference, w.grad.numpy(), rtol=1e-8, atol=1e-8)
    ordinary = FiniteDifferences(graph, FDOptions(mode="full", frozen_branches=False))
    assert np.max(np.abs(ordinary.gradient("w").reference - w.grad.numpy())) > 1e-3
