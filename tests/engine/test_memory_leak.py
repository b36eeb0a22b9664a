"""The leak the seed warns about: nothing keeps a graph alive after its report.

250 verifications (under a checkpoint policy, with dropout) and 250
inference-only evaluations in one process. After a warm-up, three measures
must not grow: the live engine objects (Graph, Program, Tape, Report: exact),
the interpreter's allocated blocks (every Python object, NumPy array headers
included) and the bytes the C heap holds in use (NumPy's buffers included). Thresholds: one kept report alone costs ~60
blocks and ~5 kB, so keeping one per iteration would grow them by ~15,000
blocks and ~1.25 MB -- over the limits -- while the noise measured after
warm-up is a few hundred blocks and a few kB, under them (per iteration, the
limits are 5 blocks and 4 kB: ROUNDS and the limits scale together, so the
per-iteration leak the test catches does not depend on ROUNDS; 250 rounds
measured 655 blocks and 4.5 kB in a first batch, 98 blocks and 64 bytes in
each later one, against limits of 1,250 blocks and 1 MiB). A control run
that keeps every 5th report shows the measure sees such a leak.

The heap is measured as glibc's mallinfo2 counts it -- bytes handed out and not
freed -- not as the resident set: the resident set also holds pages the
allocator keeps after freeing, and in a test worker that has run other tests
(threads of torch and gRPC alive, other processes loading the machine) it grew
by 2.7 MB in each of two batches with nothing leaked. Where mallinfo2 is
missing (not glibc), the resident set stands in.

Each growth is measured over two consecutive batches of ROUNDS and the smaller
counts: a leak grows every batch alike, while the allocator's one-off steps
(a new arena, a cache filled once) land in one batch and do not repeat.
(tracemalloc would also see buffers, but slows the loop tenfold.)"""
import ctypes
import gc
import os
import sys
import warnings

import numpy as np

from gradcheck_svc.backend import NUMPY
from gradcheck_svc.engine import Program, Tape, forward, prepare_feeds
from gradcheck_svc.graph import load_graph
from gradcheck_svc.graph.build import GraphBuilder
from gradcheck_svc.graph.ir import Graph
from gradcheck_svc.verify import Report, VerifyOptions, verify

ROUNDS = 250
BLOCKS_LIMIT = 5 * ROUNDS
HEAP_LIMIT = 2**20  # 4 kB a round, rounded to a power of two
KEEP_EVERY = 5  # the control's leak: every 5th report kept


def _message():
    rng = np.random.default_rng(0)
    b = GraphBuilder("leak")
    h = b.input("x", rng.uniform(-1, 1, size=(2, 4)))
    for k in range(3):
        w = b.input(f"W{k}", rng.standard_normal((4, 4)) / 2, requires_grad=True)
        h = b.node("dropout", b.node("tanh", b.node("matmul", h, w)), p=0.2, seed=k)
    b.output(b.node("sum", h, name="loss"))
    return b.build()


def _live_objects() -> int:
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on every object touches torch's deprecated aliases
        warnings.simplefilter("ignore", FutureWarning)
        return sum(isinstance(o, (Graph, Program, Tape, Report)) for o in gc.get_objects())


def _verify_once(msg, keep=None):
    report = verify(load_graph(msg), VerifyOptions(checkpoint="every:2"))
    assert report.verdict == "pass"
    report.to_json()
    report.to_text()
    if keep is not None:
        keep.append(report)


def _infer_once(msg):
    graph = load_graph(msg)
    program = Program(graph, np.float64)
    tape = forward(program, NUMPY, prepare_feeds(program, NUMPY), grad=False)
    assert np.isfinite(float(tape.loss))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def _heap() -> int:
    """Bytes the C heap holds in use now: small blocks plus mmapped ones (glibc), else the resident set."""
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        return info.uordblks + info.hblkhd
    return _rss()


def _rss() -> int:
    """Resident bytes now (Linux); 0 elsewhere, where the block and object counts still hold."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _growth(fn, msg, rounds, keep=None) -> tuple[int, int]:
    """(allocated blocks, heap bytes in use) gained over `rounds` calls, after a warm-up."""
    for _ in range(20):  # caches, interned strings, lazily imported modules
        fn(msg)
    return _batch(fn, msg, rounds, keep)


def _batch(fn, msg, rounds, keep=None) -> tuple[int, int]:
    gc.collect()
    blocks, heap = sys.getallocatedblocks(), _heap()
    for i in range(rounds):
        if keep is not None and i % KEEP_EVERY == 0:
            fn(msg, keep)
        else:
            fn(msg)
    gc.collect()
    return sys.getallocatedblocks() - blocks, _heap() - heap


def _steady_growth(fn, msg, rounds) -> tuple[int, int]:
    """The smaller growth of two consecutive batches, per measure: what every batch adds (a leak), not a
    one-off step of the allocator. The second batch runs only when the first is over a limit: the smaller
    of the two is under a limit exactly when one of them is."""
    first = _growth(fn, msg, rounds)
    if first[0] < BLOCKS_LIMIT and first[1] < HEAP_LIMIT:
        return first
    second = _batch(fn, msg, rounds)
    return min(first[0], second[0]), min(first[1], second[1])


def test_no_growth_over_250_verifications_and_250_inferences():
    msg = _message()
    objects = _live_objects()
    for what, fn in (("verifications", _verify_once), ("inference evaluations", _infer_once)):
        blocks, heap = _steady_growth(fn, msg, ROUNDS)
        assert blocks < BLOCKS_LIMIT, f"{ROUNDS} {what} left {blocks} allocated blocks behind"
        assert heap < HEAP_LIMIT, f"{ROUNDS} {what} grew the heap in use by {heap} bytes"
    assert _live_objects() == objects


def test_the_leak_measurement_sees_a_kept_report():
    """Control: keeping one report in five (ten reports a batch of 50) is visible in each batch; one per
    iteration would be over the limit in both, so the smaller of two batches still sees it."""
    kept = []
    first = _growth(_verify_once, _message(), 10 * KEEP_EVERY, kept)
    second = _batch(_verify_once, _message(), 10 * KEEP_EVERY, kept)
    per_batch = len(kept) / 2
    assert min(first[0], second[0]) / per_batch * ROUNDS > 5 * BLOCKS_LIMIT, (first, second)
    if _MALLINFO2 is not None:  # the heap sees the reports' NumPy buffers (~9 kB each)
        assert min(first[1], second[1]) / per_batch * ROUNDS > 1.5 * HEAP_LIMIT, (first, second)
