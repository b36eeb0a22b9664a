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
from grpc_helpers import ROOT, _env


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _options(parser):
    """(command, flag, action) for every optional argument of every subcommand."""
    for command, sub in _subparsers(parser):
        for a in sub._actions:
            if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction)) \
                    and a.help != argparse.SUPPRESS:  # hidden aliases of an option that is shown
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


def _blocks(text: str) -> dict:
    """The detailed form: 'name: doc' then indented lines, per op."""
    blocks = {}
    for line in text.splitlines():
        if line.startswith(" "):
            blocks[name].append(line.strip())
        elif line.startswith("formula structural"):
            break  # the footer naming the structural ops
        elif ": " in line:
            name, _, doc = line.partition(": ")
            blocks[name] = [doc]
    return blocks


def test_ops_long_shows_attributes_formula_kinks_and_doc(capsys):
    assert main(["ops", "--format", "json"]) == 0
    described = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert main(["ops", "--long"]) == 0
    text = capsys.readouterr().out
    blocks = _blocks(text)
    assert set(blocks) == {op.name for op in all_ops()}
    footer = text.split("\nformula structural", 1)[1].split(":", 1)[1]
    structural = {name.strip() for name in footer.replace("\n", " ").split(",")}
    assert text.count("structural") == 1  # said once, not once per op
    for name, d in described.items():
        body = blocks[name]
        assert body[0] == d["doc"], name
        for attr, a in d["attributes"].items():
            default = "required" if a["required"] else "default " + (
                "none" if a["default"] is None else json.dumps(a["default"]))
            assert any(line.startswith("attributes:") and f"{attr} ({a['kind']}, {default}" in line
                       for line in body), (name, attr)
        formula = [line for line in body if line.startswith("formula:")]
        if d["formula"] is not None:
            assert len(formula) == 1 and d["formula"] in formula[0], name
        elif name != "expr":
            assert not formula and name in structural, name
        for k in d["kinks"]:
            assert f"kink: {k['where']}; convention: {k['convention']}" in body, name
        assert (f"numpy: {d['numpy']}" in body) == bool(d["numpy"]), name  # the NumPy name it serves
    # spot checks against what a user would look for
    assert "kink: x == 0; convention: derivative 0" in blocks["relu"]
    assert any("axis (int, default -1)" in line for line in blocks["softmax"])
    assert "numpy: numpy.linalg.solve" in blocks["solve"] and "numpy: numpy.tanh" in blocks["tanh"]


def test_ops_lists_one_line_per_op_with_the_numpy_name_from_the_registry(capsys):
    assert main(["ops"]) == 0
    head, *rows = capsys.readouterr().out.splitlines()
    assert head.split()[:3] == ["op", "numpy", "inputs"]
    by_name = {row.split()[0]: row.split() for row in rows}
    ops = all_ops()
    assert list(by_name) == [op.name for op in ops]
    for op in ops:  # the column is the OpDef's field, '-' where NumPy has no function of the same inputs
        assert by_name[op.name][1] == (f"numpy.{op.numpy}" if op.numpy else "-"), op.name


def test_ops_one_line_listing_does_not_import_sympy():
    import subprocess
    import sys

    
    code = "import sys; from gradcheck_svc.cli import main; main(['ops']); assert 'sympy' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_ops_name_describes_one_op_and_suggests_a_misspelt_one(capsys):
    assert main(["ops", "relu"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert list(blocks) == ["relu"]
    assert any(line.startswith("formula: ") for line in blocks["relu"])
    assert main(["ops", "--op", "tanh", "--op", "square"]) == 0
    assert list(_blocks(capsys.readouterr().out)) == ["tanh", "square"]
    assert main(["ops", "sqaure"]) == 2
    assert "unknown op 'sqaure' (did you mean 'square'?)" in capsys.readouterr().err


def test_gpu_hint_names_the_package():
    from gradcheck_svc.backend import _cupy, get_backend
    from gradcheck_svc.errors import GradcheckError

    if _cupy()[0] is not None:
        pytest.skip("CuPy is usable here: no hint to show")
    with pytest.raises(GradcheckError, match=r"pip install '\.\[gpu\]' in a gradcheck checkout"):
        get_backend("cuda")


def _help(parser, *path) -> str:
    sub = parser
    for name in path:
        sub = dict(_subparsers(sub))[name]
    return sub.format_help()


@pytest.mark.parametrize("parser", [service_parser, client_parser], ids=["gradcheck-svc", "gradcheck"])
def test_verify_help_teaches_examples_and_exit_codes_and_shows_one_name_per_option(parser):
    text = _help(parser(), "verify")
    examples = text.split("examples:", 1)[1].split("exit codes:", 1)[0]
    assert examples.count(" verify ") >= 2
    assert "0 every gradient verified, 1 a gradient mismatch, 2 invalid input or usage" in " ".join(text.split())
    for hidden in ("--no-localize", "--symbolic-max-elements", "--max-symbolic-budget", "--max-symbolic-partials"):
        assert hidden not in text, hidden
    for shown in ("--localize", "--symbolic-budget", "--symbolic-max-partials", "--symbolic-timeout",
                  "--memory-plot", "--format", "--junit", "--html", "--max-nodes"):
        assert shown in text, shown
    assert "e+0" not in text  # integer limits as integers
    assert f"(default {16 * 2**20})" in " ".join(text.split())
    assert not any(m in text for m in ("TOKEN_FILE", "CA_FILE", " K ", " S "))  # FILE, N, SECONDS, X


def test_serve_help_has_a_description_and_one_spelling_of_the_message_size():
    text = _help(service_parser(), "serve")
    assert "Run the gRPC server" in text and "exit codes:" in text
    assert "--max-message-bytes" in text and "--max-message-mb" not in text


@pytest.mark.parametrize("module", ["gradcheck_svc.cli", "gradcheck_client.cli"])
def test_a_mistyped_flag_gets_a_did_you_mean(module, capsys):
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).build_parser().parse_args(["verify", "g.json", "--atoll", "1e-3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --atoll 1e-3 (did you mean --atol?)" in err and err.count("\n") == 1


@pytest.mark.parametrize("module", ["gradcheck_svc.cli", "gradcheck_client.cli"])
def test_hidden_aliases_still_work(module):
    import importlib

    parse = importlib.import_module(module).build_parser().parse_args
    args = parse(["verify", "g.json", "--no-localize", "--symbolic-max-elements", "9000", "--max-symbolic-partials",
                  "7", "--json"])
    assert (args.localize, args.symbolic_budget, args.max_symbolic_partials, args.format) == (False, 9000, 7, "json")


def test_a_symbolic_budget_alone_raises_its_cap_in_process(capsys):
    seed = str(ROOT / "examples" / "graphs" / "seed.json")
    assert main(["verify", seed, "--symbolic-budget", "9000", "--format", "json"]) == 0  # was: over the limit
    assert json.loads(capsys.readouterr().out)["symbolic"]["status"] == "ok"
    # with the cap given too, the cap holds (as a server's does)
    assert main(["verify", seed, "--symbolic-budget", "9000", "--max-symbolic-budget", "100"]) == 2
    assert "--symbolic-budget: 9000 is over the limit of 100 (raise it with --max-symbolic-budget)" in \
        capsys.readouterr().err


def test_serve_still_takes_max_message_mb():
    args = service_parser().parse_args(["serve", "--max-message-mb", "2"])
    assert args.max_message_mb == 2.0
