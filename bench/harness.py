"""Shared benchmark plumbing: fair thread settings, interleaved timing, medians,
a description of the machine, and markdown tables.

Not a benchmark itself (run_all.py runs bench_*.py only)."""
from __future__ import annotations

import os
import platform
import statistics
import time


def blas_info() -> dict:
    """numpy's BLAS as threadpoolctl sees it (library, kernel, threads)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    blas = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    # numpy's own first (SciPy's bundled OpenBLAS may be loaded beside it)
    blas.sort(key=lambda info: "numpy" not in info.get("filepath", ""))
    return blas[0] if blas else {}


_limits = []  # keeps threadpoolctl's limit in force for the whole run


def match_threads(n: int | None = None) -> int:
    """Give numpy's BLAS and torch the same number of threads: n, or by default as many
    as numpy's BLAS has, so neither side gets more cores. Without torch installed only
    numpy's BLAS is set."""
    import numpy  # noqa: F401 -- threadpoolctl limits only the BLAS libraries already loaded
    try:  # the engine's erf (scipy.special) loads SciPy's own OpenBLAS: limit it too, and name numpy's
        import scipy.special  # noqa: F401
    except ImportError:
        pass

    try:
        import torch
    except ImportError:
        torch = None

    if n is None:
        n = int(blas_info().get("num_threads") or os.cpu_count() or 1)
    else:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            raise SystemExit("--threads needs threadpoolctl (pip install threadpoolctl)") from None
        _limits.append(threadpool_limits(limits=n, user_api="blas"))
    if torch is not None:
        torch.set_num_threads(n)
    return n


def thread_counts(text: str) -> list[int]:
    """--threads "1,2" -> [1, 2]: the 1-thread run first, whatever order they were given in."""
    counts = sorted({int(t) for t in text.split(",") if t.strip()})
    if not counts or counts[0] < 1:
        raise SystemExit(f"--threads wants positive counts, e.g. 1,2 (got {text!r})")
    return counts


def machine() -> str:
    """CPU, numpy's BLAS (library, kernel, threads per threadpoolctl), torch's threads (or
    "not installed"), OPENBLAS_*/OMP_* overrides and the load average, on one line."""
    import numpy as np

    try:
        import torch
        torch_text = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        torch_text = "torch not installed"

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    blas = blas_info()
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS") if k in os.environ}
    return (f"{cpu}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}, numpy {np.__version__} "
            f"({blas.get('internal_api', '?')} {blas.get('version', '')}, kernel {blas.get('architecture', '?')}, "
            f"{blas.get('num_threads', '?')} threads), {torch_text}; "
            f"env {env or 'no OPENBLAS_*/OMP_* overrides'}; {load()}")


def load() -> str:
    """The machine's load average: other processes slow both sides, torch's OpenMP threads most."""
    try:
        return "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:
        return "load average unknown"


def interleaved(cases: dict, reps: int, warmup: int = 1, budget_s: float | None = None) -> dict[str, list[float]]:
    """Seconds per call of each case, the cases alternating within every repetition
    (and their order rotating), so background load hits all of them alike.
    Stops early once budget_s is spent (at least 3 repetitions)."""
    names = list(cases)
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            cases[n]()
            times[n].append(time.perf_counter() - t0)
        if budget_s is not None and r >= 2 and time.perf_counter() - start > budget_s:
            break
    return times


def median(xs) -> float:
    return statistics.median(xs)


def min_med(xs) -> str:
    """"min / median" of seconds, the form every table's timing cells take."""
    return f"{fmt_s(min(xs))} / {fmt_s(median(xs))}"


def fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
