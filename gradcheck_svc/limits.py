"""Every request-sized quantity the server caps, defined once.

Each LimitSpec gives a limit's name (the ServerLimits field, the proto Limits
field in GetServerInfo and, dashed, the `--max-...` flag of both `serve` and
`verify`), its default and what it bounds; `serve --help` and `verify --help`
show them from here. Light on purpose: the CLI imports it to build its parser.
"""
from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from .errors import OptionError

FORMULA_MAX_DEPTH = 64  # the formula parser's own hard cap (ops/formula.py reads it from here)


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
    LimitSpec("max_directions", 4_096, "random directions of projection finite differences"),
    LimitSpec("max_faults", 64, "fault injections in one request"),
    LimitSpec("max_request_seconds", 120.0, "seconds one verification may run", type=float, minimum=1e-3),
    LimitSpec("max_queue", 64, "requests waiting for a worker beyond the busy ones", minimum=0, server_only=True),
)
LIMIT_SPECS = {spec.name: spec for spec in LIMITS}


class _LimitMethods:
    """What ServerLimits does besides holding one field per LimitSpec."""

    @property
    def graph(self) -> Limits:
        """The part graph validation checks."""
        from .graph.validate import Limits

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
    (in `verify` the budgets they cap stand for them, gradcheck_client/options.py)."""
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


