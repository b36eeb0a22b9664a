"""The joint screen: every parameter's gradient checked at once, then bisected where it disagrees.

k random directions span all the screened parameters together (finite_diff.JointDirections: a
random unit vector per parameter block, then weighted as below), so the whole graph's directional derivative
D_j = sum_p g_p . v_jp costs 2 forwards per direction however many parameter tensors there are.
The engine's side is known per block, c_jp = g_p . v_jp, and so is what the tolerance model
allows each block: with b_i = tol.absolute(max |g_p|) + rtol * |g_i| per element (compare.py), a_jp =
sqrt(sum_i (b_i v_jpi)^2 / n_p), the typical size of the projection of errors within tolerance
divided by sqrt(n_p): one element past its tolerance b_i moves a random unit projection by
about b_i / sqrt(n_p), and the screen is to see it (legitimate rounding, far inside the
tolerance, stays below; a false alarm only costs the flagged parameter's own check). Each
block's direction is weighted so that its a_jp is (on average over j) the same for all blocks --
a wrong 32-element bias is as visible as a wrong 10^5-element weight, and a block whose gradient
vanishes (early layers of a deep chain) as one whose gradient is large. A group of blocks G is held
to the root mean square of its a_jp, as strict as a projection of one block on its own, plus the
differences' own error (fd_check: refined on the ladder where the first pass misses).

Where the whole disagrees (or finite differences cannot decide it), the blocks are split in
halves, each half's directional derivative compared on the directions that failed, down to
single parameters: those are *flagged* and checked on their own, which attributes and localizes:
in full where that is affordable, else *narrowed* (narrow(): the same sign directions restricted to
halves of the parameter's elements, bisected down to blocks of at most LEAF elements checked by
ordinary differences) -- never by fresh random projections, where one wrong element of n moves a
value by e / sqrt(n) and a flag would be cleared by a weaker check than the one that raised it.
A child is never held more loosely than its parent; where a group fails
while neither half does (a marginal error, or errors that cancel), the half further off is
followed all the same, so a disagreement always ends at a parameter checked on its own.

What a step of the bisection costs (issue 44 item 4: localizing a deep fault within 3x the clean
verification): breadth first, one level at a time, and of each split only the half with the smaller graph
below it is evaluated -- the other is the parent's values less that half's (complex steps are linear in the
direction: exact but for rounding, used where that error is under DERIVED_SHARE of its floor); a level's
evaluated halves go in one batched forward where they fit a joint chunk (FiniteDifferences.joint_many: each
copy perturbs only its own group). A group's check decides on its first pass (refining can only clear a
value, so this fails where a refined check might not, never the other way); the whole is refined, one
direction at a time until one is confirmed, and a single parameter's values where they would prove it wrong
(its Evidence). A cache corruption the engine recorded splits first: the parameters it explains (their
gradients are wrong whatever the screen shows) from the others, which their own check then clears.

The screen is a screen: it never passes a verdict on a flagged parameter, only spares the
per-parameter work where the joint derivative agrees.

How many directions (joint_k): without the option, by complex steps, the fewest from 4 to 16 in which that
guarantee (below) holds for every element; by central differences, or as the option says, exactly that many.

Its power is a guarantee (README "Finite differences"): one element i off by RESOLVE x its own bound
(tolerance + the error of its own difference: 0 for a complex step) moves direction j by the block's weight
times |s_ji| times that error, and fails it when that exceeds the direction's floor plus twice its FD
error (JointScreen.power: per element, the least error that does). Blocks where it would not
(_unresolved: a loss of magnitude 1e4, a vanishing gradient in a
large block, an element whose tolerance is far below its block's) get a second pass with a larger
step and stricter allowances (_second_pass); what is still unresolved is listed (JointScreen.
unresolved), and the verification says so (an fd_unresolved finding, the row "undecided").

Split over processes (verify/fd_shards.py): the directions are seeded, so every process makes the same ones,
and the first pass -- 2 whole-graph forwards per direction, the screen's bulk -- can be evaluated by direction
elsewhere (screen_share: the rows fd_shards.dealer deals process I; joint_screen's first_pass takes them back), for the screen
and for the second pass a passing screen takes. What follows the first pass (refining, bisecting, narrowing,
another second pass) needs the whole result and runs where it is, the code below unchanged.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..oracles.fd_complex import COMPLEX, first_noise
from ..oracles.fd_modes import FDMode
from ..oracles.fd_plan import MIN_DIRECTIONS, with_joint_directions
from ..oracles.finite_diff import FDResult
from .compare import Comparison, Tolerance, compare
from .fd_check import FDCheck, _over, elements_check, fd_check

BISECT_ROWS = 4  # failing directions followed down the bisection (the worst ones)
# narrowing a flagged parameter too large to check in full (group testing on its own sign directions):
LEAF = 64  # elements: a failing block this small has each element checked by ordinary differences
WIDE_LEAF = 1024  # a failing block whose halves both pass is checked element by element up to this size
MAX_LEAVES = 8  # blocks checked element by element before the flag is left undecided
# flagged parameters are followed up on their own (in full) the cheapest first, while their checks together
# cost at most this many times the screen's first pass (values, fd_plan.Costs); the rest are decided by their
# own directional values (Evidence): FAIL where those prove the gradient wrong, else undecided -- a deep cache
# corruption flags every parameter upstream of it, and checking each in full cost depth x elements
FOLLOW_UP_SHARE = 1.0
RESOLVE = 10  # the screen's guarantee: one element off by this many times its own bound is seen
# joint_k: the first pass's FD error (twice it), unknown before it runs, allowed for as this share of the floor --
# a complex step's is ROUND eps |D_j|, ~1e-15 of the values, where the floor is a share of the tolerance (~1e-6
# of them and more); where it is larger the screen's own check (_unresolved) sends the element to a second pass
POWER_MARGIN = 0.25
BISECT_BUDGET = 4  # the bisection's splits: as many as following this many wrong parameters down alone takes
MAX_STEP_SCALE = 64  # the second pass's step, at most this many times the first's


@dataclass
class JointScreen:
    params: list[str]
    directions: object  # finite_diff.JointDirections
    engine: np.ndarray  # (k,) sum_p g_p . v_jp
    reference: np.ndarray  # (k,) finite differences of the whole, refined where needed
    error: np.ndarray  # (k,) their estimated error
    comparison: Comparison  # engine vs reference, each allowed its floor + FD error
    refined: np.ndarray
    flagged: list[str] = field(default_factory=list)  # to be checked on their own (in full)
    # flagged parameters too large to check in full, narrowed down to their elements (Narrowed)
    narrowed: dict = field(default_factory=dict)
    # blocks with elements whose error of RESOLVE x their own bound the screen would not see, even after a
    # second pass with a larger step: p -> (elements, worst ratio); listed as unresolved, never passed
    unresolved: dict = field(default_factory=dict)
    # the power statement: p -> per element (flat, float32) the least error of that element alone that fails
    # some direction j for sure, min_j (floor_j + 2 x FD error_j) / (weight |s_ji|) -- with complex steps the
    # FD error is the forward's rounding, so the power is set by the tolerance and the directions alone
    power: Mapping = field(default_factory=dict)
    evaluations: int = 0  # forwards of (part of) the graph, bisection included
    # flagged parameters' own directional values (Evidence), and the flagged parameters not followed up on
    # their own (spare(): the follow-up's budget), decided by that evidence alone
    evidence: dict = field(default_factory=dict)
    spared: list = field(default_factory=list)
    sym_of_fd: np.ndarray | None = None  # the symbolic gradient's directional derivatives (run.py)


def element_bounds(g: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Each element's tolerance b_i (compare.py's model on the engine's gradient, flat)."""
    a = np.abs(np.asarray(g, dtype=np.float64).reshape(-1))  # (one |g| for both terms)
    return tol.absolute(float(a.max(initial=0.0))) + tol.rtol * a


def _allowed(gradients: dict, tol: Tolerance, params: list[str], fd=None) -> dict:
    """Per parameter sum(b * b) / n: a^2 (k,) is that times the block's weight squared -- (v * v) @
    (b * b) / n, every element of a sign block moving by the weight. fd (the second pass): at most
    (RESOLVE / 4 x the smallest own bound)^2, an element's own bound being its tolerance plus the
    rounding of its own central difference -- so that an element whose bound is far below its block's
    typical tolerance is seen at RESOLVE x its own. One block's bounds at a time: all of them together are as
    large as the gradients (11 M float64 for ResNet-18, at the verification's peak)."""
    out = {}
    for p in params:
        b = element_bounds(gradients[p], tol)
        out[p] = float(b @ b) / max(1, b.size)
        if fd is not None and b.size:
            own = b + fd.element_noise(p)
            out[p] = min(out[p], (RESOLVE / 4 * float(np.min(own))) ** 2)
    return out


def _check_rows(fd, dirs, group, rows, eng, floor, tol, given=None, refined=True, ref=None,
                per_batch=BISECT_ROWS):
    """fd_check of the directional derivatives of dirs' `rows` restricted to the blocks `group` against
    the engine's `eng`, each held to floor + its FD error: (the check, which rows fail or are
    undecided, how far off each is in floors). given: their first pass, evaluated elsewhere. refined: the
    rows failing on the first pass refined (per_batch at a time, worst first, until one is confirmed);
    else the first pass stands -- refining only ever clears a value, so a check left unrefined fails where
    a refined one might not, never the other way (the bisection's groups: each step then costs one forward).
    ref: the first pass, already evaluated here (fd.joint_many, or derived from the parent's: _Screening)."""
    if ref is None:
        ref = fd.joint(dirs, group, rows) if given is None else _evaluated_elsewhere(fd, dirs, group, given)
    first = ref.method == "complex"  # the probes' base point is the first pass's own (fd_complex.probed)

    def refine(which, settled):
        return fd.refine_joint(dirs, group, rows, which, settled, ref.reference[which] if first else None)
    chk = fd_check(eng, ref.reference, ref.noise, tol, refine if refined else None, floor=floor,
                   per_batch=per_batch)
    failing = _over(eng, chk.reference, floor + chk.error)
    failing[chk.undecidable] = True
    with np.errstate(all="ignore"):
        ratio = np.nan_to_num(np.abs(eng - chk.reference) / floor, nan=np.inf)
    return chk, failing, ratio


def _directions(fd, gradients: dict, params: list[str], tol: Tolerance, step_scale: float, resolve: bool):
    """The screen's directions, each block weighted (below), and what each block allows per direction:
    (JointDirections, p -> a_jp^2 (k,)). How many: joint_k's (the first pass's choice goes in the plan)."""
    # the second pass needs fewer directions: one element's error moves every direction alike
    cap = fd.options.count if resolve else max(MIN_DIRECTIONS, fd.options.count // 2)
    chosen = fd.options.directions is None and fd.method_for(params) == COMPLEX
    allowed = _allowed(gradients, tol, params, None if resolve else fd)  # (whatever k: made once)
    dirs, a2 = _weighted(fd, params, step_scale, min(cap, MIN_DIRECTIONS) if chosen else cap, allowed)
    k, why = joint_k(fd, dirs, a2, gradients, params, tol, cap) if chosen else (cap, _why_not_chosen(fd))
    if k != dirs.k:  # the same first rows, more of them (the weights and step do not depend on k)
        proven = dirs.proven_at
        dirs, a2 = _weighted(fd, params, step_scale, k, allowed)
        dirs.proven_at = proven
    if resolve and step_scale == 1.0:
        fd.plan = with_joint_directions(fd.plan, fd.costs, k, why)
    return dirs, a2


def _why_not_chosen(fd) -> str:
    if fd.options.directions is not None:
        return "as the option directions asks"
    return ("central differences: their error is only known once evaluated (the ladder's truncation), "
            "so the power cannot be stated before")


def joint_k(fd, dirs, a2: dict, gradients: dict, params: list[str], tol: Tolerance, cap: int) -> tuple[int, str]:
    """The fewest directions, MIN_DIRECTIONS to cap, in which every element's stated power meets the screen's
    goal, and why: (k, text). The power of k directions for element i of block p (JointDirections.least_error)
    is e_i(k) = min_{j<k} R_j / (w_p |s_ji|), R_j = F + 2 E_j -- F the group's floor, E_j the complex-step bound of
    value j, ROUND eps |D_j|, the rounding of one forward (fd_complex.py) -- and one element wrong by RESOLVE x its
    own bound b_i is found iff e_i(k) <= RESOLVE b_i, i.e. max_{j<k} |s_ji| >= R / (RESOLVE w_p b_i). E_j is known
    only once evaluated: 2 E_j is taken at POWER_MARGIN x F here (far above it: ROUND eps |D_j| is ~1e-15 of the
    values, F a share of the tolerance), and the screen's own check (_unresolved) holds the real one. The
    levels |s_ji| are independent over j, so an element needs more than k with probability P(|s| < m_i)^k;
    at the default tolerances (rtol 10 atol) F = w_p rms(b) and no b_i is below a tenth of that rms, so the level
    needed is at most 1.1 (1 + POWER_MARGIN) = 1.4 and k = MIN_DIRECTIONS suffices but for ~1e-6 of the elements
    (3% of levels are below 2 in magnitude); a user's tolerance with rtol far above atol asks more. Rows added
    come from the same seeded stream (JointDirections.beyond): the first k are the same whatever k, in every
    process of a split screen (fd_shards.py) alike."""
    reach = (1 + POWER_MARGIN) * float(_floor(a2, params, np.arange(1), np.inf)[0]) + 2 * float(
        np.max(fd.step_noise(dirs, params)))
    need, short_at_cap = dirs.k, 0
    dirs.proven_at = reach  # every element's power met at any reach up to this (unless some fall short below)
    for p in params:
        if dirs.weight[p] <= 0:
            continue
        # by complex steps (joint_k is asked for no other): an element's own difference adds nothing to its bound
        # (fd.element_noise is 0)
        bound = RESOLVE * element_bounds(gradients[p], tol)  # (one block's at a time, as _allowed's)
        short = np.flatnonzero(~(reach <= dirs.weight[p] * dirs.largest(p) * bound))  # least_error <= bound
        j = dirs.k
        while short.size and j < cap:  # the elements not yet seen, one more row at a time
            with np.errstate(divide="ignore"):
                seen = reach / (dirs.weight[p] * np.abs(dirs.beyond(p, j)[short].astype(np.float64))) <= bound[short]
            short, j = short[~seen], j + 1
        need, short_at_cap = max(need, j if short.size == 0 else cap), short_at_cap + short.size
    if short_at_cap:
        dirs.proven_at = None
        return cap, (f"the cap: {short_at_cap} element(s) not seen at 10x their own bound in fewer "
                     "(complex steps; a second pass takes them)")
    return need, (f"the fewest ({MIN_DIRECTIONS} to {cap}) in which one element wrong by 10x its own bound "
                  "moves some direction past what it allows (complex steps)")


def _weighted(fd, params: list[str], step_scale: float, k: int, allowed: dict):
    """k directions over params (the first k of the seeded stream), each block weighted (below), and what each
    block allows per direction: (JointDirections, p -> a_jp^2 (k,)). allowed: _allowed's."""
    dirs = fd.joint_directions(params, k)
    dirs.step *= step_scale
    # each block weighted so that what its tolerance allows is the same for all (the smallest one's):
    # a bug past its own tolerance shows as much in a block whose gradient is 1e-5 as in one whose
    # gradient is 10, rather than drowning in the large blocks' allowance. No block moves more than
    # a unit direction would, and none is weighted below the differences' own rounding: a block held
    # to 1e-11 (chain_256's first layers, compare.py's vanishing gradients) would otherwise shrink every
    # other block's signal under what finite differences resolve, and a 1% error in b5 went unseen
    scale = {p: dirs.weight[p] * math.sqrt(allowed[p]) for p in params}
    least = min((v for v in scale.values() if v > 0), default=1.0)
    target = max(least, float(fd.step_noise(dirs, params)))
    for p in params:
        if scale[p] > target:
            dirs.weight[p] *= target / scale[p]
    return dirs, {p: np.full(dirs.k, dirs.weight[p] ** 2 * allowed[p]) for p in params}


def _floor(a2: dict, group: list[str], rows: np.ndarray, ceiling) -> np.ndarray:
    """What the group's directional derivatives `rows` are allowed (the root mean square of its blocks'),
    never above ceiling."""
    return np.minimum(np.sqrt(np.mean([a2[p][rows] for p in group], axis=0)), ceiling)


def joint_screen(fd, gradients: dict, params: list[str], tol: Tolerance, step_scale: float = 1.0,
                 resolve: bool = True, first_pass=None, explained=frozenset()) -> JointScreen:
    """step_scale: the directions' step times this, and each block held to no more than its strictest
    element's own bound allows (_allowed: the second pass over the blocks the first could not resolve);
    resolve: whether blocks still unresolved get that second pass (else they are listed).
    first_pass(dirs, params) -> (k,) values or None: the whole's first-pass differences along every direction
    where they were evaluated elsewhere (fd_shards.py: the directions split over processes; None: here).
    explained: parameters whose gradient reads a saved value the engine recorded as corrupted (their
    gradients are wrong whatever the screen shows): the bisection splits them from the others first."""
    dirs, a2 = _directions(fd, gradients, params, tol, step_scale, resolve)
    sc = _Screening(fd, dirs, a2, gradients, params, tol, explained)
    before = fd.joint_rows
    flagged: dict[str, tuple] = {}  # p -> (the rows it failed on, their floors)
    every = np.arange(dirs.k)
    top, top_floor, failing, ratio = sc.check(params, every, np.inf, first_pass and first_pass(dirs, params))
    if failing.any():
        rows = every[failing][np.argsort(-ratio[failing], kind="stable")][:BISECT_ROWS]  # the worst ones
        # the bisection's splits: enough to follow BISECT_BUDGET wrong parameters down alone; a fault that flags
        # a whole depth of parameters would otherwise bisect down to every one of them
        budget = BISECT_BUDGET * max(1, math.ceil(math.log2(max(2, len(params)))))
        flagged = _bisect(sc, params, rows, top_floor[rows], (top.reference[rows], top.error[rows]), budget)
    # a flagged parameter too large to check in full is never handed to a check weaker per element
    # than the screen (a few projections, where one element moves a value by e / sqrt(n)): it is
    # narrowed on the screen's own directions down to elements, checked by ordinary differences
    narrowed = {p: narrow(fd, dirs, p, gradients[p], *flagged[p], tol)
                for p in params if p in flagged and fd.own_mode(p) == "projection"}
    screen = JointScreen(params, dirs, np.sum([sc.c[p] for p in params], axis=0), top.reference, top.error,
                         top.comparison, top.refined, [p for p in params if p in flagged and p not in narrowed],
                         narrowed)
    screen.evidence = {p: v for p, v in sc.evidence.items() if p in screen.flagged}
    # what one element's error must move a direction by to be sure to fail it: its floor plus twice its FD
    # error (the differences may be off by that much the other way), per direction; element i moves
    # direction j by weight x |s_ji| x its error, so the direction where reach_j / |s_ji| is least sees it
    reach = top_floor + 2 * top.error
    screen.power = Power(dirs, reach)
    blind = {} if dirs.proven(reach) else _unresolved(fd, dirs, gradients, params, reach, tol)
    screen.unresolved = {p: r for p, r in blind.items() if p not in flagged}
    if resolve and screen.unresolved:
        _second_pass(fd, gradients, tol, screen, first_pass, explained)
    screen.evaluations = fd.joint_rows - before
    return screen


DERIVED_SHARE = 0.01  # a half's values derived from its parent's are used where their error is under this x its floor


class _Screening:
    """One screen's checks: the engine's projections c (p -> (k,)), each group's floor, and the single
    parameters' Evidence as the bisection reaches them."""

    def __init__(self, fd, dirs, a2: dict, gradients: dict, params: list[str], tol: Tolerance, explained):
        self.fd, self.dirs, self.a2, self.gradients, self.params, self.tol = fd, dirs, a2, gradients, params, tol
        self.explained = explained
        self.c = {p: dirs.project(p, gradients[p]) for p in params}  # the engine's projections (k,)
        self.evidence: dict = {}  # p -> Evidence: its own values on the rows it was flagged on
        order = {n: i for i, s in enumerate(fd.program.steps) for n in reversed(s.inputs)}
        self.first_use = {p: order.get(p, len(order)) for p in params}

    def check(self, group, rows, ceiling, given=None, ref=None, refined=None):
        """The group's rows checked, its floor never above ceiling: (check, floor, failing, ratio). Refined
        (refined None) only where it decides the verification: the whole, one row at a time while none is
        confirmed; a group only directs the bisection, on its first pass (a single one's Evidence is
        refined where it would prove the gradient wrong: evidence_of)."""
        eng = np.sum([self.c[p][rows] for p in group], axis=0)
        floor = _floor(self.a2, group, rows, ceiling)
        whole = len(group) == len(self.params)
        chk, failing, ratio = _check_rows(self.fd, self.dirs, group, rows, eng, floor, self.tol, given,
                                          refined=whole if refined is None else refined, ref=ref,
                                          per_batch=1 if whole else BISECT_ROWS)
        return chk, floor, failing, ratio

    def evidence_of(self, p: str, rows, chk, failing, again) -> None:
        """Single parameter p's Evidence from its check on `rows`; where those first-pass values prove its
        gradient wrong, again() -> (check, failing) refines them first (refining only adds to their error)."""
        if p in self.evidence:
            return
        ev = _evidence(self.dirs, p, self.gradients[p], rows, self.c[p][rows], chk, failing, self.tol)
        if ev.confirmed and len(chk.refined) < len(rows):
            chk, failing = again()
            ev = _evidence(self.dirs, p, self.gradients[p], rows, self.c[p][rows], chk, failing, self.tol)
        self.evidence[p] = ev

    def split(self, group: list[str]) -> tuple:
        """A group's halves: those a recorded corruption explains and the others, where it holds both (the
        others' own check then clears them, where a split through the middle left parameters on both
        sides of the corruption flagged together); else its first and second half."""
        inside = [p for p in group if p in self.explained]
        if 0 < len(inside) < len(group):
            return [p for p in group if p not in self.explained], inside
        mid = len(group) // 2
        return group[:mid], group[mid:]

    def refiner(self, group, rows, ceiling, ref):
        """again() for evidence_of: the group's check on `rows` refined, from its first pass `ref`."""
        def again():
            chk, _, failing, _ = self.check(group, rows, ceiling, ref=ref, refined=True)
            return chk, failing
        return again

    def first_passes(self, splits: list) -> list:
        """[(pair of halves, rows, ceiling, (parent's values, their errors))] -> their first passes, [(FDResult,
        FDResult)]: the half with the later first use (the smaller graph below it) evaluated, every split's
        in one batched evaluation (fd.joint_many); the other the parent's values less those -- complex steps
        are linear in the direction, exactly but for rounding -- where that error is small next to its
        floor, else evaluated too."""
        fd, dirs = self.fd, self.dirs
        late = [int(min(self.first_use[p] for p in pair[1]) >= min(self.first_use[p] for p in pair[0]))
                for pair, *_ in splits]
        done = fd.joint_many(dirs, [(pair[i], rows) for (pair, rows, *_), i in zip(splits, late)])
        out, again = [], []
        for (pair, rows, ceiling, (values, errors)), i, ref in zip(splits, late, done):
            other = _derived(ref, values, errors) if ref.method == COMPLEX == fd.method_for(self.params) else None
            if other is None or np.any(~(other.noise <= DERIVED_SHARE * _floor(self.a2, pair[1 - i], rows, ceiling))):
                again.append(len(out))
                other = None
            out.append([ref, other] if i == 0 else [other, ref])
        redone = iter(fd.joint_many(dirs, [(splits[n][0][1 - late[n]], splits[n][1]) for n in again]))
        for n in again:
            out[n][1 - late[n]] = next(redone)
        return out


def _derived(ref: FDResult, values: np.ndarray, errors: np.ndarray) -> FDResult:
    """The other half's first pass: the parent's values less this half's, their errors added, with the
    subtraction's rounding."""
    v = values - ref.reference
    with np.errstate(invalid="ignore"):
        noise = errors + ref.noise + first_noise(np.abs(values) + np.abs(ref.reference))
    return FDResult(FDMode.JOINT, v, noise, evaluations=0, method=COMPLEX)


def _bisect(sc: _Screening, params: list[str], rows: np.ndarray, ceiling: np.ndarray, values: tuple,
            budget: int) -> dict:
    """The failing group `params` split in halves, breadth first, each half checked on the directions its
    parent failed (values: the parent's first pass there, and its errors), down to single parameters, whose
    checks give their Evidence. A level's halves are evaluated together (sc.first_passes: one half of each
    split in one batched forward where they fit, the other derived). After `budget` splits, the groups still
    failing are flagged whole, each member with no evidence of its own. Returns p -> (the rows it failed on,
    their floors)."""
    flagged: dict[str, tuple] = {}
    level, splits = [(params, rows, ceiling, values)], 0
    while level:
        splitting = []
        for group, rows, ceiling, values in level:
            if len(group) == 1 or splits >= budget:
                for p in group:
                    flagged.setdefault(p, (rows, ceiling))
                continue
            splits += 1
            splitting.append((sc.split(group), rows, ceiling, values))
        level = []
        for (pair, rows, ceiling, _), refs in zip(splitting, sc.first_passes(splitting)):
            halves = [(half, *sc.check(half, rows, ceiling, ref=ref)) for half, ref in zip(pair, refs)]
            for (half, chk, _, failing, _), ref in zip(halves, refs):
                if len(half) == 1:
                    sc.evidence_of(half[0], rows, chk, failing, sc.refiner(half, rows, ceiling, ref))
            level += _followed(halves, rows)
    return flagged


def _followed(halves: list, rows: np.ndarray) -> list:
    """The halves of one split to follow down: (half, its failing rows, their floors, (its values there,
    their errors)) for each half that fails; where neither does though the whole disagreed (a marginal error,
    or errors that cancel), the half further off on all these directions -- never clear the whole group."""
    bad = [(half, chk, floor, failing) for half, chk, floor, failing, _ in halves if failing.any()]
    if not bad:
        half, chk, floor, _, _ = max(halves, key=lambda h: float(np.max(h[4])))
        bad = [(half, chk, floor, np.ones(len(rows), bool))]
    return [(half, rows[f], floor[f], (chk.reference[f], chk.error[f])) for half, chk, floor, f in bad]


class Power(Mapping):
    """The screen's power statement, p -> per element (flat, float32) the least error of that element alone that
    fails some direction for sure (JointDirections.least_error at the first pass's reach), made when asked for:
    where joint_k proved every element within RESOLVE x its bound at a reach no smaller, the screen does not
    make it (a pass over every element and direction, 13% of MLP-1024's verification)."""

    def __init__(self, dirs, reach: np.ndarray):
        self.dirs, self.reach = dirs, reach

    def __getitem__(self, p: str) -> np.ndarray:
        return self.dirs.least_error(p, self.reach).astype(np.float32)

    def __iter__(self):
        return (p for p, w in self.dirs.weight.items() if w > 0)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _unresolved(fd, dirs, gradients: dict, params: list[str], reach: np.ndarray, tol: Tolerance) -> dict:
    """p -> (how many elements, the worst ratio): the elements of each block that one error of 10x their
    own bound -- tolerance + the error of their own difference (0 for a complex step) -- would move no
    direction j past what it allows (reach[j], (k,)): such an error moves direction j by weight x |s_ji| x
    error (JointDirections.least_error: the per-element power of the directions; JointScreen.power states it)."""
    out = {}
    for p in params:
        if dirs.weight[p] <= 0:
            continue
        bound = element_bounds(gradients[p], tol) + fd.element_noise(p)
        least = dirs.least_error(p, reach)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = least / (RESOLVE * bound)
        blind = ratio > 1
        if blind.any():
            out[p] = (int(blind.sum()), float(np.max(ratio)))
    return out


def _evaluated_elsewhere(fd, dirs, params, values) -> FDResult:
    """A first pass another process evaluated, as fd.joint gives it (its error the rounding term of the
    step) and counted as evaluated: a report counts the work its verdict rests on, wherever it ran."""
    m = len(values)
    values = np.asarray(values, dtype=np.float64)
    method = fd.method_for(params)
    per = 1 if method == "complex" else 2
    fd.joint_rows += per * m
    return FDResult("joint", values, fd.step_noise(dirs, params, values), evaluations=per * m, method=method)


def _second_plan(params: list[str], unresolved: dict) -> tuple[list[str], float]:
    """The second pass's blocks (those unresolved, in the screen's order) and its step scale."""
    worst = max(r for _, r in unresolved.values())
    return [p for p in params if p in unresolved], min(MAX_STEP_SCALE, 2 * worst)


def screen_share(fd, gradients: dict, params: list[str], tol: Tolerance, deal) -> list:
    """The first-pass differences one process of several evaluates for a screen of `params` split by
    direction (fd_shards.py): deal(k) -> its rows of a pass of k directions (fd_shards.dealer), of the screen's
    and of its second pass the one the screen takes when no direction needs refining or bisecting (a passing
    graph's; any other is the merge's to evaluate). [(dirs, params, rows, values)]; the same directions in
    every process (seeded)."""
    dirs, a2 = _directions(fd, gradients, params, tol, 1.0, True)
    out = [_rows_of(fd, dirs, params, deal(dirs.k))]
    every = np.arange(dirs.k)
    # as joint_screen's reach, when every first-pass value stands (its error the rounding term)
    reach = _floor(a2, params, every, np.inf) + 2 * np.full(dirs.k, fd.step_noise(dirs, params))
    unresolved = {} if dirs.proven(reach) else _unresolved(fd, dirs, gradients, params, reach, tol)
    if unresolved:
        blind, scale = _second_plan(params, unresolved)
        again, _ = _directions(fd, gradients, blind, tol, scale, False)
        out.append(_rows_of(fd, again, blind, deal(again.k)))
    return out


def _rows_of(fd, dirs, params: list[str], rows: np.ndarray) -> tuple:
    return dirs, params, rows, fd.joint(dirs, params, rows).reference


def _second_pass(fd, gradients: dict, tol: Tolerance, screen: JointScreen, first_pass=None,
                 explained=frozenset()) -> None:
    """The blocks the screen could not resolve, screened again on their own with a larger step (the
    rounding term, eps |L| / h, is what blinds it: a loss of magnitude 1e4, a vanishing gradient) and
    each held to no more than its strictest element's own bound allows (an allowance set by the block's
    typical tolerance hides an element whose own is far below it); a larger step's truncation error fails
    directions rather than hiding errors, and those are refined on the ladder of steps (Richardson
    included) like any other. What is still unresolved stays listed."""
    blind, scale = _second_plan(screen.params, screen.unresolved)
    again = joint_screen(fd, gradients, blind, tol, step_scale=scale, resolve=False, first_pass=first_pass,
                         explained=explained)
    screen.flagged += [p for p in again.flagged if p not in screen.flagged]
    screen.narrowed.update(again.narrowed)
    screen.evidence.update(again.evidence)
    screen.unresolved = again.unresolved


@dataclass
class Evidence:
    """A flagged parameter's own directional values: the screen's directions restricted to its block, on
    the rows it failed (all it was checked on, where none did). A gradient within tolerance is off along
    direction j by at most weight x sum_i b_i |s_ji| (`bound`, each element i within its bound b_i): off by
    more, the difference's own error on top, along any row proves the gradient wrong (`confirmed`) whatever
    its elements would show one by one. Within it, the screen's flag (its floor is a typical projection of
    such errors, far below their worst case) proves nothing: only the parameter's own check decides."""
    rows: np.ndarray
    engine: np.ndarray  # the engine's directional derivatives along them
    reference: np.ndarray  # finite differences of the loss along them (refined where needed)
    error: np.ndarray  # their error
    bound: np.ndarray  # the most a gradient within tolerance could be off along each
    confirmed: bool


def _evidence(dirs, p: str, g: np.ndarray, rows: np.ndarray, eng: np.ndarray, chk: FDCheck, failing: np.ndarray,
              tol: Tolerance) -> Evidence:
    """The Evidence of the single block p checked on `rows` (chk; `failing` those it failed or left
    undecidable). An undecidable difference proves nothing."""
    keep = failing if failing.any() else np.ones(len(rows), bool)
    b = element_bounds(g, tol)
    bound = dirs.weight[p] * (np.abs(dirs.signs[p][rows[keep]]).astype(np.float64) @ b)
    decided = np.ones(len(rows), bool)
    decided[chk.undecidable] = False
    with np.errstate(all="ignore"):
        proves = decided[keep] & (np.abs(eng - chk.reference)[keep] > bound + chk.error[keep])
    return Evidence(rows[keep], eng[keep], chk.reference[keep], chk.error[keep], bound, bool(proves.any()))


def spare(fd, screen: JointScreen) -> list[str]:
    """The flagged parameters not followed up on their own: all but the first of them -- those their own
    values (Evidence) do not already prove wrong before those they do, each the cheapest first -- taken while
    their full checks together cost at most FOLLOW_UP_SHARE x the screen's first pass: what a faulty
    verification adds stays proportional to the clean one however many parameters the fault reaches. Each
    is decided by its Evidence: FAIL where it proves the gradient wrong, else undecided (never a pass).
    Each full check counted at its dense bound (fd_plan.Costs: never below what it costs, and no forward
    to measure it -- a measurement is a forward through everything downstream of the parameter)."""
    # at the directions' cap, the first pass the plan budgets, not the fewer its power may choose: the follow-up
    # decides as many flags in full as with 16 directions (fewer directions must not leave more undecided)
    budget = FOLLOW_UP_SHARE * fd.costs.joint_cost(fd.options.count)
    spent, out = 0.0, []

    def order(p):  # those their own values do not already prove wrong first: without a follow-up, undecided
        return p in screen.evidence and screen.evidence[p].confirmed, fd.costs.dense_full_cost(p)

    for i, p in enumerate(sorted((p for p in screen.flagged if p not in screen.narrowed), key=order)):
        spent += fd.costs.dense_full_cost(p)
        if i and spent > budget:  # the first is always followed up (as every flagged one was before)
            out.append(p)
    return [p for p in screen.params if p in out]


@dataclass
class Narrowed:
    """A flagged parameter narrowed to elements: the screen's failing directions restricted to halves of
    the parameter's elements (the same signs, so one wrong element moves each half's value as much as it
    moved the whole's), bisected where they still fail, then the elements of the blocks reached checked
    by ordinary central differences (FiniteDifferences.one_hot_losses), which have per-element power."""

    param: str
    index: np.ndarray  # flat indices checked by ordinary differences
    check: FDCheck  # those elements (fd_check, the tolerance model plus each difference's error)
    # why the screen's flag is neither confirmed nor cleared (None: decided): the parameter is undecided
    unresolved: str | None
    evaluations: int  # forwards of (part of) the graph spent narrowing


def narrow(fd, dirs, p: str, g: np.ndarray, rows: np.ndarray, ceiling: np.ndarray, tol: Tolerance) -> Narrowed:
    """Group testing of the flagged parameter p on the screen's failing `rows` (floors at most `ceiling`),
    depth first, the block further off first; stops at the first element confirmed wrong."""
    shape = np.shape(g)
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    b = element_bounds(g, tol)
    start, spent = fd.joint_rows, 0
    todo = [(0, g.size, rows, ceiling)]
    checks: list[tuple[np.ndarray, FDCheck]] = []
    unresolved = None

    def sub_check(lo, hi, rows, ceiling):
        signs = np.zeros((len(rows), g.size), np.int8)
        signs[:, lo:hi] = dirs.signs[p][rows, lo:hi]
        sub = type(dirs)({p: signs}, {p: dirs.weight[p]}, dirs.step)
        floor = np.minimum(dirs.weight[p] * math.sqrt(float(b[lo:hi] @ b[lo:hi]) / (hi - lo)), ceiling)
        _, failing, ratio = _check_rows(fd, sub, [p], np.arange(len(rows)), sub.project(p, g), floor, tol)
        return failing, ratio, floor

    while todo:
        lo, hi, rows, ceiling = todo.pop()
        if hi - lo > LEAF:
            mid = (lo + hi) // 2
            halves = [(l, h, *sub_check(l, h, rows, ceiling)) for l, h in ((lo, mid), (mid, hi))]
            bad = sorted((h for h in halves if h[2].any()), key=lambda h: float(np.max(h[3])))
            if bad:  # the one further off last: checked first
                todo += [(l, h, rows[failing], floor[failing]) for l, h, failing, _, floor in bad]
                continue
            if hi - lo > WIDE_LEAF:  # the parts do not reproduce the whole's disagreement
                unresolved = (f"the joint screen's disagreement could not be narrowed below {hi - lo} of its "
                              f"{g.size} elements")
                break
        index = np.arange(lo, hi)
        chk = elements_check(fd, p, g, index, tol, element_bounds(g, tol)[index])
        spent += 2 * index.size
        checks.append((index, chk))
        if not chk.passed:
            break
        if len(checks) >= MAX_LEAVES and todo:
            unresolved = f"the joint screen's disagreement was not confirmed in {len(checks)} blocks checked"
            break
    index = np.concatenate([i for i, _ in checks]) if checks else np.zeros(0, np.intp)
    # elements undecidable by FD (a kink nearer than every step) are the row's fd_undecidable, as in a full
    # check: the kink analysis decides them
    chk = _merge(g, shape, index, checks, tol)
    return Narrowed(p, index, chk, unresolved, fd.joint_rows - start + spent)


def _merge(g: np.ndarray, shape: tuple, index: np.ndarray, checks: list, tol: Tolerance) -> FDCheck:
    """One FDCheck over the whole parameter (g flat, compared in `shape`) from the element checks of its
    blocks: the elements not checked carry the engine's value and no error (compared with themselves),
    the indices are flat."""
    ref, error = g.copy(), np.zeros(g.size)
    parts = {"refined": [], "undecidable": [], "unrefined": [], "unconfirmed": []}
    for idx, chk in checks:
        ref[idx], error[idx] = chk.reference, chk.error
        for key in parts:
            parts[key].append(idx[getattr(chk, key)])
    flat = {k: np.concatenate(v) if v else np.zeros(0, np.intp) for k, v in parts.items()}
    out = np.zeros(g.size, bool)
    out[flat["undecidable"]] = out[flat["unconfirmed"]] = True
    floor = element_bounds(g, tol) + error
    cmp = compare(g.reshape(shape), np.where(out, g, ref).reshape(shape), Tolerance(0.0, 0.0), floor.reshape(shape))
    return FDCheck(cmp, ref, error, flat["refined"], flat["undecidable"], flat["unrefined"], flat["unconfirmed"])


def usable(fd, gradients: dict, params: list[str]) -> bool:
    """The joint screen needs a finite loss, finite parameters and finite engine gradients: one NaN
    would make every joint value NaN (and NaN == NaN agrees); per-parameter checks and the
    non-finite diagnosis take such graphs."""
    if not params or not math.isfinite(fd.loss):
        return False
    return all(np.isfinite(np.asarray(fd.base[p], dtype=np.float64)).all() and
               np.isfinite(np.asarray(gradients[p], dtype=np.float64)).all() for p in params)
