"""Every verification option, defined once.

Each Option is one `VerifyOptions` field: its name is the protobuf field, the JSON key, the keyword
of `Client.verify()` / `verify_many()`, and (dashed, with the few historical spellings kept as
aliases) the flag of both `gradcheck verify` and `gradcheck-svc verify`. Where the verifier's own
dataclass spells the concept otherwise (an oracle's option, e.g. symbolic_budget is
SymbolicOptions.max_elements), `target` names that field, once, here: every mapping reads it. Its default is what the
server uses when the option is unset, and its help text is shared by both commands and the docs'
option table (tests/client/test_options_table.py checks that the proto, both parsers, the server's
defaults and the docs all agree with this table).

It lives in gradcheck_core, below both the service and the client: both read it from here.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# The longest time limit a flag accepts (--max-request-seconds, batch's --time-limit, the CI command's
# --timeout). A bounded call waits in select.poll, whose timeout is an int of milliseconds (24.8 days at
# most): over that, the wait itself fails. 1,000,000 s (11.6 days) is far beyond any verification, so a
# larger value (inf included) is refused naming its flag, never crashes the run as an internal error.
MAX_SECONDS = 1_000_000


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


non_negative_int.__name__ = "non-negative integer"  # argparse: "invalid non-negative integer value: '-1'"


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(text)
    return text == "on"


on_off.__name__ = "on|off"


@dataclass(frozen=True)
class Option:
    name: str  # VerifyOptions field and client keyword
    help: str
    type: object = str  # argparse type (also the Python type of the value)
    default: object = None  # the server's value when unset (None: it depends, see help)
    choices: tuple | None = None
    metavar: str | None = None
    flag: str = ""  # default: --NAME with dashes
    aliases: tuple = ()  # earlier spellings of the flag, still accepted
    repeated: bool = False  # a list: the flag may be given several times
    switch: bool = False  # a boolean flag without a value (--allow-inplace-hazards)
    negation: str | None = None  # a flag that sets the option to False (--no-localize)
    target: str = ""  # the gradcheck_svc VerifyOptions field it sets ("symbolic.max_elements"; default: name),
    # or "validate.X": an argument of the graph's validation (graph/validate.py), not of the verifier
    extra: dict = field(default_factory=dict)
    wire_bits: int = 64  # an integer's field width in service.proto: beyond it the flag refuses the value

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple:
        return (self.cli_flag, *self.aliases)


OPTIONS: tuple[Option, ...] = (
    Option("fd_mode", "finite differences: every element (full), random directions per parameter "
           "(projection), random directions spanning all parameters at once, then per parameter only where "
           "they disagree (joint), or by cost (auto)", default="auto", choices=("auto", "full", "projection", "joint"),
           flag="--fd", target="fd.mode"),
    Option("dtype", "engine precision (default: the graph's float dtype)", choices=("float32", "float64")),
    Option("device", "engine device", default="cpu", choices=("cpu", "cuda")),
    Option("atol", "absolute tolerance (default per dtype)", type=float, metavar="X"),
    Option("rtol", "relative tolerance (default per dtype)", type=float, metavar="X"),
    Option("directions", "random directions: N per parameter in projection mode (default 16), and exactly N for "
           "the joint screen (default: the fewest, 4 to 16, in which one element wrong by 10x its own bound moves "
           "some direction past what it allows -- by complex steps; central differences take 16)", type=int,
           metavar="N", target="fd.directions", wire_bits=32),
    Option("seed", "seed for the projection directions (0 or more)", type=non_negative_int, default=0,
           metavar="N", target="fd.seed"),
    Option("faults", "corrupt NODE's cached value between forward and backward (KIND: overwrite, scale, zero, "
           "nan, bitflip, stale); repeatable", metavar="NODE:KIND[:VALUE]", flag="--fault", repeated=True),
    Option("symbolic_budget", "symbolic oracle budget: scalar elements (inputs plus node outputs)", type=int,
           default=5000, metavar="N", aliases=("--symbolic-max-elements",), target="symbolic.max_elements"),
    Option("localize", "find the faulty node and its cause when a gradient fails", type=on_off, default=True,
           metavar="on|off", negation="--no-localize"),
    Option("checkpoint", "gradient checkpointing for the verified gradients: none, sqrt, every:K, budget:BYTES "
           "(the least recomputation keeping the activations under BYTES; exact on chains, a heuristic on DAGs), "
           "or a comma-separated list of node names to keep", default="none", metavar="POLICY"),
    Option("integrity", "fingerprint tensors saved for backward and check them when read", default="check",
           choices=("off", "check")),
    Option("allow_inplace_hazards", "when an in-place node overwrote a value the backward needs, compute the "
           "(wrong) gradient and diagnose it instead of stopping with an error", type=bool, default=False,
           switch=True),
    Option("symbolic", "exact SymPy reference gradient for graphs within its budget", type=on_off, default=True,
           metavar="on|off", target="symbolic.enabled"),
    Option("allow_nonfinite", "accept NaN/Inf in input data (refused by default, naming the input); the "
           "report names the input as their origin", type=bool, default=False, switch=True,
           target="validate.allow_nonfinite"),  # the graph's validation's, not the verifier's
    Option("memory_timeline", "record live bytes after every forward/backward step into the report "
           "(memory_timelines; drawn by --html)", type=bool, default=False, switch=True),
    Option("memory_profile", "the report's memory profile (`memory`): besides the gradient run, an inference "
           "forward and a checkpointed what-if (sqrt, or the policy's metering forward); off: only the gradient "
           "run, `memory` empty (--memory-timeline, --memory-plot and --html turn it on)", type=on_off,
           default=True, metavar="on|off"),
    Option("optimizer", "the optimizer whose state joins the training memory figure: none, sgd (no state), "
           "momentum (1x the parameters), adam or adamw (2x)", default="none",
           choices=("none", "sgd", "momentum", "adam", "adamw")),
    Option("optimizer_dtype", "dtype of the optimizer's state (default: the engine's)",
           choices=("float16", "bfloat16", "float32", "float64")),
    Option("fd_method", "finite differences' arithmetic: complex steps (exact directional derivatives from one "
           "complex forward, no rounding term eps|L|/h) wherever every op downstream of a parameter has a complex "
           "form, real central differences for the others (complex), or real central differences everywhere "
           "(central)", default="complex", choices=("complex", "central"), target="fd.method"),
)
BY_NAME = {o.name: o for o in OPTIONS}


def _help(o: Option) -> str:
    """The help text with the default stated (unless the text already says it)."""
    if "default" in o.help:
        return o.help
    if o.switch:
        return f"{o.help} (default off)"
    if o.default is None:
        return f"{o.help} (default none)"
    shown = {True: "on", False: "off"}.get(o.default, o.default) if o.type is on_off else o.default
    return f"{o.help} (default {shown})"


def _wire_int(o: Option):
    """o.type bounded to its service.proto integer field: a larger value is argparse's one-line usage error
    (exit 2), not the message's ValueError inside the verification (an internal error, exit 3)."""
    top = 2 ** (o.wire_bits - 1) - 1

    def parse(text: str) -> int:
        value = o.type(text)
        if not -top - 1 <= value <= top:
            raise argparse.ArgumentTypeError(f"{text[:40]} is out of range (at most 2**{o.wire_bits - 1}-1)")
        return value

    parse.__name__ = o.type.__name__  # argparse: "invalid non-negative integer value: '-1'" as before
    return parse


def add_flag(group, o: Option, dest: str) -> None:
    """One option row as argparse flags (and its negation); an unset flag is None. The ONNX import
    options (onnx_options.py) are rows of the same kind."""
    for flags, text in ((o.cli_flag,), _help(o)), (o.aliases, argparse.SUPPRESS):  # aliases: accepted, not shown
        if not flags:
            continue
        if o.switch:
            group.add_argument(*flags, dest=dest, action="store_const", const=True, default=None, help=text)
        else:
            kind = _wire_int(o) if o.type in (int, non_negative_int) else o.type
            group.add_argument(*flags, dest=dest, type=kind, choices=o.choices, metavar=o.metavar,
                               action="append" if o.repeated else "store", default=None, help=text)
    if o.switch:
        return
    if o.negation:  # an earlier spelling, still accepted; hidden so that help shows one name per option
        group.add_argument(o.negation, dest=dest, action="store_const", const=False, help=argparse.SUPPRESS)


def add_option_flags(parser: argparse.ArgumentParser, exclude: tuple = ()) -> None:
    """Every option (but those in `exclude`, which the command defines its own way) as a flag;
    an unset flag is None (the server's default applies)."""
    group = parser.add_argument_group("verification options (the same for gradcheck and gradcheck-svc)")
    for o in OPTIONS:
        if o.name not in exclude:
            add_flag(group, o, o.name)


def values_from_args(args) -> dict:
    """Option name -> value for the flags given (unset ones left out)."""
    return {o.name: getattr(args, o.name) for o in OPTIONS if getattr(args, o.name, None) is not None}


def flag_of(name: str) -> str:
    return (BY_NAME.get(name) or IN_PROCESS_BY_NAME[name]).cli_flag


def target_of(o: Option) -> tuple[str, ...]:
    """The VerifyOptions attribute path the option sets: ("symbolic", "max_elements"), ("dtype",)."""
    return tuple((o.target or o.name).split("."))


# --- the rest of a `verify` command: the same flags for `gradcheck verify` and `gradcheck-svc verify` -----------
# Both commands build their verify parser with add_verify_arguments, so they take the same paths, outputs,
# options and limits by construction; tests/client/test_options_table.py lists (and justifies) the few flags only
# one of them has.

# Budgets of the symbolic oracle that no request carries (no VerifyOptions field): they apply where the
# verification runs in this process (gradcheck-svc verify; gradcheck verify without --server). Defaults
# are SymbolicOptions' (oracles/symbolic.py; a test checks they agree).
IN_PROCESS_OPTIONS: tuple[Option, ...] = (
    Option("symbolic_max_partials", "symbolic oracle budget: non-zero local partial derivatives", type=int,
           default=250_000, metavar="N", target="symbolic.max_edges"),
    Option("symbolic_timeout", "symbolic oracle wall-clock budget", type=float, default=30.0, metavar="SECONDS",
           target="symbolic.timeout_s"),
    Option("simplify_timeout", "time to prove a user derivative (an expr node's) equal to SymPy's", type=float,
           default=10.0, metavar="SECONDS", target="symbolic.simplify_timeout_s"),
)
IN_PROCESS_BY_NAME = {o.name: o for o in IN_PROCESS_OPTIONS}
# In a verify run a symbolic budget and the limit on it overlap: the budget asked for is allowed (its cap
# rises to it), so help shows the budget only; the cap flags stay accepted, hidden, and when given they
# still cap the budget (scripts that mirror a server's limits keep their meaning).
VERIFY_HIDDEN_LIMITS = {"symbolic_budget": "max_symbolic_budget", "symbolic_max_partials": "max_symbolic_partials"}
OUTPUT_FORMATS = ("text", "json")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with the description and epilog (examples, exit codes) laid out as written."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


class CommandParser(argparse.ArgumentParser):
    """Both commands' parser (`gradcheck`, `gradcheck-svc`): usage errors are one line and exit 2 (the
    exit-code contract), a mistyped flag of the subcommand given gets a did-you-mean."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        args, unknown = self.parse_known_args(args, namespace)
        if unknown:
            subs = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), {})
            sub = subs.get(getattr(args, "command", None), self)
            sub.error(f"unrecognized arguments: {' '.join(unknown)}{suggest_flag(sub, unknown)}")
        return args


def in_process_values(args) -> dict:
    """IN_PROCESS_OPTIONS name -> value for the flags given (unset ones left out)."""
    return {o.name: getattr(args, o.name) for o in IN_PROCESS_OPTIONS if getattr(args, o.name, None) is not None}


def plot_path(file: str, graph: str, several: bool) -> str:
    """Where --memory-plot FILE draws one graph: FILE itself, or with several graphs FILE with the graph's
    file name before its suffix (plot.svg, a/seed.json -> plot.seed.svg)."""
    if not several:
        return file
    from pathlib import Path

    f = Path(file)
    return str(f.with_name(f"{f.stem}.{Path(graph).stem}{f.suffix}"))


def suggest_flag(parser: argparse.ArgumentParser, unknown: list) -> str:
    """' (did you mean --atol?)' for the first mistyped flag among `unknown`, from the parser's flags
    (hidden aliases included), or ''."""
    import difflib

    flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
    for word in unknown:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.7)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""
