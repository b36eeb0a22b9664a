"""How many joint directions (verify/joint_check.py joint_k): by complex steps the fewest, 4 to 16, in which
every element's stated power -- the least error of that element alone that moves some direction past its reach,
min_{j<k} R / (w |s_ji|) -- is at most 10x its own bound; rows added come from the same seeded stream, so the
first k are the same whatever k. Small shapes: one 256-element parameter under a linear loss, whose gradient
is exactly the coefficients chosen here (so each element's bound is chosen too)."""
import numpy as np
import pytest

from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.oracles.fd_joint import JointDirections
from gradcheck_svc.oracles.finite_diff import FDOptions, FiniteDifferences
from gradcheck_svc.verify.compare import Tolerance
from gradcheck_svc.verify.joint_check import POWER_MARGIN, RESOLVE, element_bounds, joint_screen

N, RTOL = 256, 1e-6


def test_rows_past_k_are_the_rows_a_larger_draw_holds():
    values = {"a": np.zeros((16, 20)), "b": np.zeros(7)}
    few, many = JointDirections.random(values, 4, seed=11), JointDirections.random(values, 12, seed=11)
    for p in values:
        assert np.array_equal(few.signs[p], many.signs[p][:4])
        for j in range(4, 12):
            assert np.array_equal(few.beyond(p, j), many.row(p, j))


def _linear(c: np.ndarray, directions=None) -> FiniteDifferences:
    """L = sum(W * c): dL/dW = c exactly."""
    b = GraphBuilder("linear")
    w = b.input("W", np.linspace(-1, 1, c.size), requires_grad=True)
    b.output(b.node("sum", b.node("mul", w, b.input("c", c)), name="L"))
    return FiniteDifferences(load_graph(b.build()), FDOptions(mode="joint", directions=directions))


def _levels(fd) -> np.ndarray:
    """|levels| of the first 16 rows over W, as the screen draws them (seeded by the graph's content)."""
    return np.abs(fd.joint_directions(["W"], 16).signs["W"]).astype(np.float64)


def _planted():
    """An element i whose gradient is 0 (its bound atol alone) while every other's is 1 (atol + rtol), atol set so
    that the level i needs with the first pass's error at 0, m0 = rms(b) / (RESOLVE b_i), is half a level above
    its largest in the first 4 rows (so 4 rows miss its goal), and joint_k's need, (1 + POWER_MARGIN) m0, is met by
    some later row: then exactly the rows through the first level >= that need are taken (levels are integers,
    the need kept 0.05 from one; rtol 1e-6: an error of 10 b_i at i moves b_i by 1e-5). Returns (fd, gradient,
    tolerance, i, that row). The directions' seed follows the graph's content, c included: i is the first element
    for which its own graph's levels qualify."""
    for i in range(N):
        c = np.ones(N)
        c[i] = 0.0
        fd = _linear(c)
        s = _levels(fd)[:, i]
        m0 = s[:4].max() + 0.5
        need = (1 + POWER_MARGIN) * m0
        if s[4:].max() >= need and abs(need - round(need)) > 0.05:
            break
    # rms(b) / atol = RESOLVE m0, with N - 1 bounds atol + rtol and one atol
    t = np.sqrt(((RESOLVE * m0) ** 2 * N - 1) / (N - 1)) - 1
    return fd, c, Tolerance(RTOL / t, RTOL), i, 4 + int(np.argmax(s[4:] >= need))


def test_an_element_whose_first_levels_are_small_forces_more_directions_and_is_then_found():
    fd, c, tol, i, row = _planted()
    assert 4 <= row < 16
    bound = element_bounds(c, tol)
    wrong = c.copy()
    wrong[i] += RESOLVE * bound[i]  # one element wrong by 10x its own bound, the others exact
    screen = joint_screen(fd, {"W": wrong}, ["W"], tol)
    # the fewest rows in which element i's power meets its goal: through the first level above what it needs
    assert screen.directions.k == row + 1 < 16
    assert fd.plan.directions == row + 1 and fd.plan.directions_why.startswith("the fewest (4 to 16)")
    # the stated power (the screen's own, with the first pass's real error): every element within 10x its bound
    assert np.all(screen.power["W"] <= RESOLVE * element_bounds(wrong, tol))
    assert not screen.unresolved
    # ... and the planted element is seen: the screen flags W (its own check then localizes the element)
    assert screen.flagged == ["W"] or list(screen.narrowed) == ["W"]


def test_the_same_element_correct_passes_at_the_chosen_k_and_the_option_stays_exact():
    fd, c, tol, i, row = _planted()
    screen = joint_screen(fd, {"W": c}, ["W"], tol)
    assert screen.directions.k == row + 1 and not screen.flagged and not screen.unresolved
    # an explicit count is that count, whatever the power would choose: at 4, element i's power misses its goal
    # (the first pass lists W as unresolved, and a second pass takes it)
    explicit = _linear(c, directions=4)
    four = joint_screen(explicit, {"W": c}, ["W"], tol)
    assert four.directions.k == 4 and explicit.plan.directions_why == "as the option directions asks"
    assert four.power["W"][i] > RESOLVE * element_bounds(c, tol)[i]


def test_at_default_tolerances_four_directions_meet_the_power():
    """rtol = 10 atol (compare.DEFAULT_TOLERANCES): no element's bound is below a tenth of its block's typical
    one, so the level each needs, at most 2 x 11 / 10, is met by the first 4 rows (every level is at least 1 in
    magnitude, and one of 4 is rarely below 3)."""
    rng = np.random.default_rng(5)
    c = rng.standard_normal(N) * np.exp(rng.uniform(-6, 2, N))  # gradients over 8 decades
    fd = _linear(c)
    tol = Tolerance.for_dtype("float64")
    screen = joint_screen(fd, {"W": c}, ["W"], tol)
    assert screen.directions.k == 4 and not screen.flagged and not screen.unresolved
    assert np.all(screen.power["W"] <= RESOLVE * element_bounds(c, tol))
