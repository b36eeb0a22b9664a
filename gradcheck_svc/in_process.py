"""The steps both in-process `verify` commands share (`gradcheck-svc verify` and the CI command's
`gradcheck verify` without a server): the flags checked and mapped to limits, options and symbolic
budgets, the one way; a limit's refusal naming the flag that raises it. Neither command's front end
lives here, so the CI command does not import the service's CLI."""
from __future__ import annotations

from contextlib import contextmanager


def verify_setup(args):
    """The limits, options and symbolic budgets of an in-process verification, from the flags (both
    `verify` commands): OptionError / LimitError naming the flag, before any graph is read."""
    import dataclasses

    from gradcheck_core.options import (IN_PROCESS_OPTIONS, VERIFY_HIDDEN_LIMITS, flag_of, in_process_values,
                                          values_from_args)

    from .errors import LimitError, OptionError
    from .limits import LIMIT_SPECS, ServerLimits, limit_flag_values
    from .request import verify_options

    values, local = values_from_args(args), in_process_values(args)
    for o in IN_PROCESS_OPTIONS:
        if o.name in local and not local[o.name] > 0:  # NaN too
            raise OptionError("must be positive", field=o.cli_flag)
    flags = limit_flag_values(args)
    # a budget asked for here is allowed here, unless its (hidden) cap flag is given too: VERIFY_HIDDEN_LIMITS
    for budget, limit in VERIFY_HIDDEN_LIMITS.items():
        asked = values.get(budget, local.get(budget))
        if asked is not None and flags.get(limit) is None and asked > LIMIT_SPECS[limit].default:
            flags[limit] = asked
    limits = ServerLimits.from_flags(flags)
    options = verify_options(values, limits, field=flag_of, hint=True)  # the server's own mapping
    symbolic = symbolic_budgets(local)
    options.symbolic = dataclasses.replace(options.symbolic, **symbolic)
    if options.symbolic.max_edges > limits.max_symbolic_partials:
        raise LimitError(f"{options.symbolic.max_edges} is over the limit of {limits.max_symbolic_partials} "
                         "(raise it with --max-symbolic-partials)", field="--symbolic-max-partials")
    if args.memory_plot is not None and not args.memory_plot.lower().endswith((".svg", ".png")):
        raise OptionError(f"'{args.memory_plot}': the plot file must end in .svg or .png", field="memory-plot")
    # the memory plot and the page draw the timeline: have the verifier record it
    options.memory_timeline = options.memory_timeline or args.memory_plot is not None or args.html is not None
    return limits, values, options, symbolic


def symbolic_budgets(local: dict) -> dict:
    """SymbolicOptions fields from the in-process flags given (IN_PROCESS_OPTIONS: each names its field)."""
    from gradcheck_core.options import IN_PROCESS_BY_NAME, target_of

    fields = {name: target_of(IN_PROCESS_BY_NAME[name]) for name in local}
    assert all(f[0] == "symbolic" for f in fields.values()), fields  # the in-process budgets are the oracle's
    return {fields[name][1]: value for name, value in local.items()}


def hinted(exc: BaseException) -> BaseException:
    """A LimitError from importing or validating an ONNX model names its limit; where the limit is the user's
    to raise (a model is not edited to fit), its one line also says which flag raises it. Anything else is
    returned as it is."""
    from .errors import LimitError, TimeLimitError
    from .limits import _raise_hint

    if not isinstance(exc, LimitError) or getattr(exc, "limit", None) is None or isinstance(exc, TimeLimitError) \
            or "raise it with" in exc.reason:
        return exc
    return LimitError(exc.reason + _raise_hint(exc.limit), node=exc.node, field=exc.field, limit=exc.limit)


@contextmanager
def limit_hints(enabled: bool = True):
    """hinted(), for a flow of exceptions: on for an ONNX model; a graph file's refusal stays the server's
    message word for word (tests/graph/test_bad_input_corpus.py)."""
    try:
        yield
    except Exception as exc:
        new = hinted(exc) if enabled else exc
        if new is exc:
            raise
        raise new from None
