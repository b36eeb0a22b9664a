"""`gradcheck-svc ops` describes every op fully, and every CLI option says what it does and its
default (issue 13 item 2), for both commands: gradcheck-svc and the CI command gradcheck."""
from __future__ import annotations

import argparse
import json

import pytest
from gradcheck_client.cli import build_parser as client_parser

from gradcheck_svc.cli import build_parser as service_parser
from gradcheck_svc.cli import main
from gradcheck_svc.ops import all_ops


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _options(parser):
    """(command, flag, action) for every optional argument of every subcommand."""
    for command, sub in _subparsers(parser):
        for a in sub._actions:
            if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
                yield command, a.option_strings[0], a


@pytest.mark.parametrize("parser", [service_parser, client_parser], ids=["gradcheck-svc", "gradcheck"])
def test_every_option_has_help_with_its_default(parser):
    missing = []
    for command, flag, a in _options(parser()):
        text = a.help or ""
        # a flag that only negates another (--no-localize) points at it; the other states the default
        if not text or ("default" not in text and not text.startswith("the same as") and not a.required):
            missing.append(f"{command} {flag}: {text!r}")
    assert not missing, "options without help or without their default:\n" + "\n".join(missing)


def test_symbolic_budget_defaults_are_shown():
    from gradcheck_svc.verify.options import VerifyOptions

    sym = VerifyOptions().symbolic
    verify = dict(_subparsers(service_parser()))["verify"]
    helps = {a.option_strings[0]: a.help % {"default": a.default} for a in verify._actions if a.option_strings}
    assert f"(default {sym.max_edges})" in helps["--symbolic-max-partials"]
    assert f"(default {sym.timeout_s})" in helps["--symbolic-timeout"]
    assert f"(default {sym.simplify_timeout_s})" in helps["--simplify-timeout"]


def test_every_op_has_a_one_line_doc():
    bad = [op.name for op in all_ops() if not op.doc.strip() or "\n" in op.doc]
    assert not bad, f"ops without a one-line doc: {bad}"


def test_ops_text_shows_attributes_formula_kinks_and_doc(capsys):
    assert main(["ops", "--format", "json"]) == 0
    described = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert main(["ops"]) == 0
    text = capsys.readouterr().out
    blocks = {}
    for line in text.splitlines():
        if not line.startswith(" "):
            name, _, doc = line.partition(": ")
            blocks[name] = [doc]
        else:
            blocks[name].append(line.strip())
    assert set(blocks) == {op.name for op in all_ops()}
    for name, d in described.items():
        body = blocks[name]
        assert body[0] == d["doc"], name
        for attr, a in d["attributes"].items():
            default = "required" if a["required"] else "default " + (
                "none" if a["default"] is None else json.dumps(a["default"]))
            assert any(line.startswith("attributes:") and f"{attr} ({a['kind']}, {default}" in line
                       for line in body), (name, attr)
        formula = [line for line in body if line.startswith("formula:")]
        assert len(formula) == 1, name
        if d["formula"] is not None:
            assert d["formula"] in formula[0], name
        elif name != "expr":
            assert "structural" in formula[0], name
        for k in d["kinks"]:
            assert f"kink: {k['where']}; convention: {k['convention']}" in body, name
        assert (f"numpy: {d['numpy']}" in body) == bool(d["numpy"]), name  # the NumPy name it serves
    # spot checks against what a user would look for
    assert "kink: x == 0; convention: derivative 0" in blocks["relu"]
    assert any("axis (int, default -1)" in line for line in blocks["softmax"])
    assert "numpy: numpy.linalg.solve" in blocks["solve"] and "numpy: numpy.tanh" in blocks["tanh"]


def test_gpu_hint_names_the_package():
    from gradcheck_svc.backend import _cupy, get_backend
    from gradcheck_svc.errors import GradcheckError

    if _cupy()[0] is not None:
        pytest.skip("CuPy is usable here: no hint to show")
    with pytest.raises(GradcheckError, match=r"install gradcheck-svc\[gpu\]"):
        get_backend("cuda")
