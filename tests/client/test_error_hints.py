"""Errors that say the fix (issue 27 item 5): an unknown fault target, a non-scalar output, a missing output and
a misspelt JSON field each end in the nearest valid names or the node to add -- one line, exit 2 on both verify
commands, INVALID_ARGUMENT from the server."""
from __future__ import annotations

import json
import subprocess

import grpc
import pytest

import forked_cli
from gradcheck_client import Client, VerifyError
from gradcheck_core.hints import hint
from grpc_helpers import EXAMPLES, ROOT, _env, module_server

SEED = EXAMPLES / "seed.json"  # values: w, x, four, z, a, L

FAULT = "fault names unknown value 'zz' (did you mean 'z'?)"
FAULT_FAR = "fault names unknown value 'qqq' (values: 'L', 'a', 'four', 'w', 'x', ... 6 in all)"
NON_SCALAR = ("output must be a float scalar (the loss), got float of shape [3] "
              "(add a 'sum' or 'mean' node reading 'e' and make it the output)")
MISSING = "output 'LL' is not an input or node (did you mean 'L'?)"
FIELD = "unknown field 'requireGrad' at Graph.inputs[0] (did you mean 'requiresGrad'?)"


def _seed(**change) -> dict:
    g = json.loads(SEED.read_text())
    g.update(change)
    return g


def _vector_output() -> dict:
    return {"inputs": [{"name": "v", "value": {"shape": [3], "data": [1, 2, 3]}, "requiresGrad": True}],
            "nodes": [{"name": "e", "op": "exp", "inputs": ["v"]}], "output": "e"}


def _misspelt_field() -> str:
    return SEED.read_text().replace('"requiresGrad": true}', '"requireGrad": true}', 1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


def _run(command: str, args: list) -> subprocess.CompletedProcess:
    """`verify ARGS` in-process, in a fork of this process (tests/forked_cli.py: its main, environment, pipes and
    exit status)."""
    mod = {"svc": "gradcheck_svc.cli", "ci": "gradcheck_client.cli"}[command]
    return forked_cli.run(mod, "verify", *args, env=_env(), cwd=ROOT, timeout=120)


def _one_line_with(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    [line] = [ln for ln in (r.stdout + r.stderr).splitlines() if needle in ln]
    assert line.endswith(needle), line


def test_hint_lists_the_nearest_names_or_some_names():
    assert hint("zz", ["z", "a"]) == " (did you mean 'z'?)"
    assert hint("nodez", ["nodes", "name"], n=1) == " (did you mean 'nodes'?)"
    assert hint("q", ["b", "a"], what="values") == " (values: 'a', 'b')"
    assert hint("q", []) == ""


@pytest.mark.parametrize("command", ["svc", "ci"])
@pytest.mark.parametrize("fault,needle", [("zz:overwrite:0", FAULT), ("qqq:overwrite:0", FAULT_FAR)])
def test_unknown_fault_target_lists_the_nearest_values(command, fault, needle):
    _one_line_with(_run(command, [str(SEED), "--fault", fault]), needle)


@pytest.mark.parametrize("command", ["svc", "ci"])
@pytest.mark.parametrize("graph,needle", [(_vector_output(), NON_SCALAR), (_seed(output="LL"), MISSING)])
def test_output_errors_say_the_fix(command, graph, needle, tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph))
    _one_line_with(_run(command, [str(path)]), needle)


@pytest.mark.parametrize("command", ["svc", "ci"])
def test_a_misspelt_json_field_names_the_valid_one(command, tmp_path):
    path = tmp_path / "g.json"
    path.write_text(_misspelt_field())
    r = _run(command, [str(path)])
    _one_line_with(r, FIELD)
    assert "Available Fields" not in r.stdout + r.stderr


def test_the_server_says_the_same_as_invalid_argument(server):
    with Client(server.target) as c:
        for graph, options, needle in [(_vector_output(), {}, NON_SCALAR), (_seed(output="LL"), {}, MISSING),
                                       (_seed(), {"faults": ["zz:overwrite:0"]}, FAULT)]:
            with pytest.raises(VerifyError) as err:
                c.verify(graph, timeout=60, **options)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert err.value.message.endswith(needle), err.value.message


def test_a_misspelt_field_in_a_dict_given_to_the_client_names_the_valid_one():
    from gradcheck_core.graphio import GraphFileError, to_graph

    graph = _seed()
    graph["inputs"][0]["requireGrad"] = graph["inputs"][0].pop("requiresGrad")
    with pytest.raises(GraphFileError) as err:
        to_graph(graph)
    assert str(err.value).endswith(FIELD) and "\n" not in str(err.value)
