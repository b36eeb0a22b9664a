"""Every request-sized quantity the server caps, defined once.

Each LimitSpec gives a limit's name (the ServerLimits field, the proto Limits
field in GetServerInfo and, dashed, the `--max-...` flag of both `serve` and
`verify`), its default and what it bounds; `serve --help` and `verify --help`
show them from here. Light on purpose: the CLI imports it to build its parser.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, make_dataclass

from gradcheck_core.options import MAX_SECONDS

from .errors import LimitError, OptionError, TimeLimitError

FORMULA_MAX_DEPTH = 64  # the formula parser's own hard cap (ops/formula.py reads it from here)


@dataclass(frozen=True)
class Limits:
    """Size caps on a request's graph, as graph validation checks them (graph/validate.py; the server's come
    from LIMITS below, through ServerLimits.graph). Defined here so that validation imports this module and
    not the other way round."""
    max_nodes: int = 1_000_000
    max_elements: int = 50_000_000  # total elements over all inputs and node outputs
    max_name_length: int = 4096  # graph, input and node names (and the names nodes refer to)
    max_attribute_values: int = 1_000_000  # JSON values in one node's attributes
    max_formula_chars: int = 100_000  # one string attribute (formulas)
    max_formula_depth: int = FORMULA_MAX_DEPTH  # parenthesis nesting in one string attribute


@dataclass(frozen=True)
class LimitSpec:
    """One request-sized quantity the server caps: its name (a ServerLimits field, the proto
    Limits field and, dashed, the `--max-...` flag of `serve` and `verify`), default and meaning."""
    name: str
    default: int | float
    help: str
    type: type = int
    minimum: int | float = 1
    maximum: int | float | None = None
    server_only: bool = False  # bounds the server, not a request: no `verify` flag


LIMITS = (
    LimitSpec("max_message_bytes", 16 * 2**20, "bytes of one request or response"),
    LimitSpec("max_nodes", 100_000, "nodes in one graph"),
    LimitSpec("max_elements", 10_000_000, "tensor elements in one graph (inputs and node outputs)"),
    LimitSpec("max_name_length", 256, "characters in a graph, input or node name"),
    LimitSpec("max_attribute_values", 100_000, "values in one node's attributes (list items, keys)"),
    LimitSpec("max_formula_chars", 10_000, "characters in one formula attribute"),
    LimitSpec("max_formula_depth", FORMULA_MAX_DEPTH, "nesting depth of a formula's parentheses (the parser "
              "refuses deeper than its own cap, the default, whatever the limit)", maximum=FORMULA_MAX_DEPTH),
    LimitSpec("max_symbolic_budget", 5_000, "scalar elements the symbolic oracle may expand"),
    LimitSpec("max_symbolic_partials", 250_000, "local partial derivatives the symbolic oracle may build"),
    LimitSpec("max_directions", 4_096, "random directions of projection and joint finite differences"),
    LimitSpec("max_faults", 64, "fault injections in one request"),
    LimitSpec("max_request_seconds", 120.0, "seconds one verification may run", type=float, minimum=1e-3,
              maximum=MAX_SECONDS),
    LimitSpec("max_queue", 64, "requests waiting for a worker beyond the busy ones", minimum=0, server_only=True),
)
LIMIT_SPECS = {spec.name: spec for spec in LIMITS}


class _LimitMethods:
    """What ServerLimits does besides holding one field per LimitSpec."""

    @property
    def graph(self) -> Limits:
        """The part graph validation checks."""
        return Limits(max_nodes=self.max_nodes, max_elements=self.max_elements,
                      max_name_length=self.max_name_length, max_attribute_values=self.max_attribute_values,
                      max_formula_chars=self.max_formula_chars, max_formula_depth=self.max_formula_depth)

    @classmethod
    def from_flags(cls, values: dict) -> "ServerLimits":
        """From `--max-...` flag values by limit name (None: the default); OptionError out of range."""
        given = {}
        for name, value in values.items():
            if value is None:
                continue
            spec = LIMIT_SPECS[name]
            flag = "--" + name.replace("_", "-")
            if not value >= spec.minimum:  # NaN too
                words = {1: "must be positive", 0: "must be 0 or more"}.get(spec.minimum)
                raise OptionError(words or f"must be at least {spec.minimum}", field=flag)
            if spec.maximum is not None and value > spec.maximum:
                raise OptionError(f"must be at most {spec.maximum}", field=flag)
            given[name] = spec.type(value)
        return cls(**given)


# The caps in force: one field per LIMITS row, named and defaulted there (`verify` in-process
# applies the same ones). Built from the table so a new limit cannot be left out of it.
ServerLimits = make_dataclass("ServerLimits", [(spec.name, spec.type, spec.default) for spec in LIMITS],
                              bases=(_LimitMethods,), frozen=True)
ServerLimits.__module__ = __name__  # (make_dataclass's own `module=` is Python 3.12+) so workers unpickle it


def add_limit_flags(parser, *, server: bool, what: str, hidden: tuple = ()) -> None:
    """`--max-...` for every limit that bounds a request (both `serve` and `verify`), and for the
    server's own (server_only) when `server`; the limits named in `hidden` are accepted but not shown
    (in `verify` the budgets they cap stand for them, gradcheck_core/options.py)."""
    import argparse

    group = parser.add_argument_group(f"limits ({what})")
    for spec in LIMITS:
        if spec.server_only and not server:
            continue
        text = argparse.SUPPRESS if spec.name in hidden else f"{spec.help} (default {spec.default})"  # not 1.6e+07
        group.add_argument("--" + spec.name.replace("_", "-"), type=spec.type, default=None,
                           metavar="SECONDS" if spec.type is float else "N", help=text)


def limit_flag_values(args) -> dict:
    return {spec.name: getattr(args, spec.name, None) for spec in LIMITS}


# -- enforced alike by the server and in-process (`gradcheck-svc verify`, the client's in-process mode) --

def _raise_hint(limit: str | None) -> str:
    """' (raise it with --FLAG)' for the command line, where the limit (or a flag) is the user's to raise."""
    return f" (raise it with --{limit.replace('_', '-')})" if limit else ""


def check_request_size(size: int, limit: int, hint: bool = False) -> None:
    """LimitError for a serialized VerifyRequest over max_message_bytes (the server measures the bytes it
    received; in-process, the request the CI command would send)."""
    if size > limit:
        raise LimitError(f"request is {size} bytes, the limit is {limit}{_raise_hint('max_message_bytes' if hint else None)}",
                         field="request")


def over_time_message(seconds: float) -> str:
    """What a verification stopped at max_request_seconds says, from the server and in-process alike."""
    return f"verification exceeded the per-request limit of {seconds:g} s"


def over_time_error(seconds: float, hint: str | None = "max_request_seconds") -> TimeLimitError:
    """The in-process limit's error: the server's message and the flag that raises it (`hint`)."""
    return TimeLimitError(over_time_message(seconds) + _raise_hint(hint))


class _OverTime(BaseException):  # raised in the main thread; no `except Exception` in the verifier may swallow it
    pass


_TIMER_SIGNAL = "SIGUSR2"  # not SIGALRM: the expr check keeps the one interval timer (alarm.py) for its own budget


@contextmanager
def _interrupt_main_after(seconds: float):
    """Raise _OverTime in the main thread once `seconds` have passed in the block: a timer thread sends
    the main thread a signal whose handler raises (Python code stops at its next bytecode; a single
    long NumPy call finishes first)."""
    import signal
    import threading

    sig = getattr(signal, _TIMER_SIGNAL)
    main = threading.main_thread().ident
    state = {"inside": True}

    def expired(signum, frame):
        if state["inside"]:
            state["inside"] = False  # once: the cleanup below is never interrupted
            raise _OverTime

    previous = signal.signal(sig, expired)  # (the first statement of `finally` disarms it before any call)
    timer = threading.Timer(seconds, signal.pthread_kill, (main, sig))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        state["inside"] = False
        timer.cancel()
        timer.join()  # a signal it sent has been delivered (to `expired`, now a no-op) before the restore
        signal.signal(sig, previous)


@contextmanager
def request_time_limit(seconds: float, hint: str | None = "max_request_seconds"):
    """In-process max_request_seconds where no child process can do the work (bounded.py's fallback, and
    library callers): TimeLimitError once `seconds` have passed in the block (the server kills the worker
    instead; bounded.py kills its child). Off the main thread, where no signal can stop the work, a block
    that ran over is refused when it ends: never a result past the limit."""
    import signal
    import threading

    start = time.monotonic()
    try:
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_kill"):
            with _interrupt_main_after(seconds):
                yield
        else:
            yield
    except _OverTime:
        raise over_time_error(seconds, hint) from None
    if time.monotonic() - start > seconds:
        raise over_time_error(seconds, hint)
