"""Every verification option, defined once.

Each Option is one `VerifyOptions` field: its name is the protobuf field, the keyword of
`Client.verify()` / `verify_many()`, and (dashed, with the few historical spellings kept as
aliases) the flag of both `gradcheck verify` and `gradcheck-svc verify`. Its default is what the
server uses when the option is unset, and its help text is shared by both commands and the docs'
option table (tests/test_options_table.py checks that the proto, both parsers, the server's
defaults and the docs all agree with this table).

It lives in the client package because the server depends on the client package, not the other
way round: both read it from here.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field


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
    extra: dict = field(default_factory=dict)

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
           flag="--fd"),
    Option("dtype", "engine precision (default: the graph's float dtype)", choices=("float32", "float64")),
    Option("device", "engine device", default="cpu", choices=("cpu", "cuda")),
    Option("atol", "absolute tolerance (default per dtype)", type=float, metavar="X"),
    Option("rtol", "relative tolerance (default per dtype)", type=float, metavar="X"),
    Option("directions", "random directions in projection mode", type=int, default=16, metavar="K"),
    Option("seed", "seed for the projection directions (0 or more)", type=non_negative_int, default=0,
           metavar="S"),
    Option("faults", "corrupt NODE's cached value between forward and backward (KIND: overwrite, scale, zero, "
           "nan, bitflip, stale); repeatable", metavar="NODE:KIND[:VALUE]", flag="--fault", repeated=True),
    Option("symbolic_budget", "symbolic oracle budget: scalar elements (inputs plus node outputs)", type=int,
           default=5000, metavar="N", aliases=("--symbolic-max-elements",)),
    Option("localize", "find the faulty node and its cause when a gradient fails", type=on_off, default=True,
           metavar="on|off", negation="--no-localize"),
    Option("checkpoint", "gradient checkpointing for the verified gradients: none, sqrt, every:K, or a "
           "comma-separated list of node names to keep", default="none", metavar="POLICY"),
    Option("integrity", "fingerprint tensors saved for backward and check them when read", default="check",
           choices=("off", "check")),
    Option("allow_inplace_hazards", "when an in-place node overwrote a value the backward needs, compute the "
           "(wrong) gradient and diagnose it instead of stopping with an error", type=bool, default=False,
           switch=True),
    Option("symbolic", "exact SymPy reference gradient for graphs within its budget", type=on_off, default=True,
           metavar="on|off"),
    Option("allow_nonfinite", "accept NaN/Inf in input data (refused by default, naming the input); the "
           "report names the input as their origin", type=bool, default=False, switch=True),
    Option("memory_timeline", "record live bytes after every forward/backward step into the report "
           "(memory_timelines; drawn by --html)", type=bool, default=False, switch=True),
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


def add_flag(group, o: Option, dest: str) -> None:
    """One option row as argparse flags (and its negation); an unset flag is None. The ONNX import
    options (onnx_options.py) are rows of the same kind."""
    if o.switch:
        group.add_argument(*o.flags, dest=dest, action="store_const", const=True, default=None, help=_help(o))
        return
    group.add_argument(*o.flags, dest=dest, type=o.type, choices=o.choices, metavar=o.metavar,
                       action="append" if o.repeated else "store", default=None, help=_help(o))
    if o.negation:
        group.add_argument(o.negation, dest=dest, action="store_const", const=False,
                           help=f"the same as {o.cli_flag} off")


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
    return BY_NAME[name].cli_flag
