"""Docs that run (issue 27 item 4): every fenced code block in README.md and docs/*.md carries a language, and
every ```python, ```bash/```sh and ```console block is executed here, as a reader pastes it:

- from a fresh folder holding the repository's examples/ (and graphs/, standing for the reader's own folder of
  graph files: a few passing examples), with `gradcheck`/`gradcheck-svc` on PATH running this checkout's code;
- against a real loopback server started here, whose address replaces `localhost:50051`;
- python: one subprocess per document, each block exec'd in a fresh namespace, as a reader pastes it alone (issue
  44 item 3): a block that uses an earlier block's names says so with `<!-- continues: REASON -->` before its
  fence and runs in the namespace of the python block before it; bash/sh: each block by `bash -e`, a line whose
  comment says `exit N` must exit N;
- console: `$ COMMAND` then the output the docs show; the shown lines must appear in the real output, in order and
  adjacent, modulo whitespace and durations (`0.353 s`); a shown line ending in `...` matches a line it begins;
  a line `...` stands for any lines.

A block that cannot run here says why in an HTML comment right before its fence: `<!-- not-run: needs a cluster -->`
(the reason is printed); `<!-- run-without: pip install | gradcheck-svc serve -->` drops the lines that begin so
(the test's venv is installed; its server stands in for the one the block starts); a ```json block after
`<!-- output-of: COMMAND -->` must be part of COMMAND's JSON output or of a value nested in it (each shown key
with its value; a shown object against a list: part of one of its items). ```text, ```json and ```yaml blocks
are synopses, outputs and data: never run (yaml only with a not-run marker, being CI configuration)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpc_helpers import EXAMPLES, ROOT, _env, module_server

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "bash", "sh", "console"}
DATA = {"text", "json"}
FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", re.S | re.M)
MARKER = re.compile(r"<!--\s*(not-run|run-without|output-of|continues):\s*((?:(?!-->).)*?)\s*-->\s*\Z", re.S)
READERS_GRAPHS = ["seed.json", "shared_value.json", "inplace_relu.json"]  # graphs/ in the docs: the reader's folder

# What a document's Python blocks print, as their comments say (regexes, each matching its own line of stdout),
# and the files its blocks write (in the reader's folder).
PRINTED = {
    "README.md": [r"^pass \[\[", r"^checked .* with respect to x, w; its output .* was reduced to",
                  r"^node 'x' \(input\): gradient_mismatch - its claimed gradient disagrees with the symbolic "
                  r"gradient \(worst \[0, 1\]: claimed 0.028412042, reference 0.1215364, off by 0.0931; "],
    "service.md": [r"^pass \[\] \[\]$", r"^seed pass$", r"^mlp pass$", r"^pass$", r"^pass$",  # cnn, tracer
                   r"^pass \[\[", r"^checked .* with respect to x, w; its output .* was reduced to",
                   r"^fail \[\('w', 'ok'\), \('x', 'FAIL'\)\]$"],
    "torch.md": [r"^fail Cube$", r"^custom autograd.Function Cube \(",
                 r"^the function's values: FAIL: torch's gradient disagrees", r"^pass$"],
}
WRITTEN = {"README.md": ["out/runs"], "memory.md": ["mem.svg"], "service.md": ["layer.json"]}


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    code: str
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        doc = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc.name
        return f"{doc}:{self.line}"


    @property
    def continues(self) -> bool:
        return bool(self.marker and self.marker[0] == "continues")


def doc_blocks(doc: Path) -> list[Block]:
    out = []
    text = doc.read_text()
    for m in FENCE.finditer(text):
        mk = MARKER.search(text[:m.start()])
        out.append(Block(doc, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                         (mk.group(1), mk.group(2)) if mk else None))
    return out


def blocks() -> list[Block]:
    return [b for doc in DOCS for b in doc_blocks(doc)]


BLOCKS = blocks()


def test_every_block_has_a_language_and_markers_have_reasons():
    for b in BLOCKS:
        assert b.lang in RUN | DATA | {"yaml"}, f"{b.where}: fence without a known language ({b.lang!r})"
        if b.lang == "yaml":
            assert b.marker and b.marker[0] == "not-run", f"{b.where}: CI yaml needs a not-run marker saying why"
        if b.marker:
            assert b.marker[1], f"{b.where}: a marker needs a reason"
            if b.marker[0] == "output-of":
                assert b.lang == "json", f"{b.where}: output-of is for json blocks"
            elif b.marker[0] == "continues":
                assert b.lang == "python", f"{b.where}: continues is for python blocks"
            else:
                assert b.lang not in DATA, f"{b.where}: a marker on a block that never runs"
    for doc in DOCS:  # a marker not right before a fence would silently mark nothing
        text = doc.read_text()
        for m in re.finditer(r"<!--\s*(not-run|run-without|output-of|continues):.*?-->\s*", text, re.S):
            assert text[m.end():].startswith("```"), f"{doc.name}: marker at {m.group(0)!r} is not before a fence"


def test_the_docs_have_the_blocks_this_test_runs():
    """Guards the extraction itself: a broken fence pattern would otherwise run nothing and pass."""
    runs = [b for b in BLOCKS if b.lang in RUN and not (b.marker and b.marker[0] == "not-run")]
    assert sum(b.lang == "python" for b in runs) >= 8 and sum(b.lang == "console" for b in runs) >= 5
    assert sum(b.lang in ("bash", "sh") for b in runs) >= 3
    assert any(b.doc.name == "README.md" and "gradcheck verify" in b.code for b in runs)  # the quick start


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--workers", "1")


@pytest.fixture(scope="module")
def reader(tmp_path_factory, server):
    """A reader's folder and environment: examples/, graphs/, the commands on PATH, the server's address."""
    cwd = tmp_path_factory.mktemp("reader")
    (cwd / "examples").symlink_to(EXAMPLES.parent)
    (cwd / "graphs").mkdir()
    for name in READERS_GRAPHS:
        shutil.copy(EXAMPLES / name, cwd / "graphs" / name)
    bin_dir = tmp_path_factory.mktemp("bin")
    for cmd, module in (("gradcheck", "gradcheck_client.cli"), ("gradcheck-svc", "gradcheck_svc.cli")):
        (bin_dir / cmd).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        (bin_dir / cmd).chmod(0o755)
    env = _env({"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"})
    env.pop("GRADCHECK_SERVER", None)
    return cwd, env


def _code(b: Block, server) -> str:
    code = b.code.replace("localhost:50051", server.target) if server else b.code
    if b.marker and b.marker[0] == "run-without":
        drop = tuple(p.strip() for p in b.marker[1].split("|"))
        code = "\n".join(ln for ln in code.splitlines() if not ln.startswith(drop))
    return code


def _bash(code: str) -> str:
    """`CMD  # exit N ...` lines become a check that CMD exits N (set -e stops on any other failing line)."""
    lines = []
    for ln in code.splitlines():
        m = re.match(r"(.*?)\s+#.*\bexit (\d+)\b", ln)
        if m:
            cmd, want = m.group(1), m.group(2)
            ln = (f"if {cmd}; then rc=0; else rc=$?; fi; "
                  f"[ $rc = {want} ] || {{ echo 'exit '$rc', the docs say {want}: {cmd}' >&2; exit 99; }}")
        lines.append(ln)
    return "set -e\n" + "\n".join(lines) + "\n"


def _norm(line: str) -> str:
    line = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)? s\b", "<T> s", line)
    return " ".join(line.split())


def _shown_in(shown: list[str], real: list[str]) -> str | None:
    """None when every shown line appears in `real` in order (see the module doc); else the first one missing."""
    real = [_norm(r) for r in real]
    i, gap = 0, False
    for s in shown:
        s = _norm(s)
        if s == "...":
            gap = True
            continue
        prefix = s.endswith("...")
        want = s[:-3].rstrip() if prefix else s
        j = i
        while j < len(real) and not (real[j].startswith(want) if prefix else real[j] == want):
            j += 1
        if j == len(real) or (j > i and not gap and i > 0):
            return s
        i, gap = j + 1, False
    return None


def _console(code: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for ln in code.splitlines():
        if ln.startswith("$ "):
            steps.append((ln[2:], []))
        else:
            assert steps, f"console output before any command: {ln!r}"
            steps[-1][1].append(ln)
    return steps


def python_script(py: list[Block], server) -> str:
    """One script running a document's python blocks in order: each in a fresh namespace, a `continues` block in
    the namespace of the block before it (the first block cannot continue anything)."""
    lines = []
    for i, b in enumerate(py):
        assert not (b.continues and i == 0), f"{b.where}: continues, but no python block before it runs"
        if not b.continues:
            lines.append("ns = {}")
        lines.append(f"exec(compile({_code(b, server)!r}, {b.where!r}, 'exec'), ns)")
    return "\n".join(lines) + "\n"


def _run(args, cwd, env, **kw):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_doc_snippets_run(doc, server, reader):
    cwd, env = reader
    mine = [b for b in BLOCKS if b.doc == doc and b.lang in RUN]
    ran, skipped = [], []
    for b in mine:
        if b.marker and b.marker[0] == "not-run":
            skipped.append(b)
            print(f"not run: {b.where} ({b.lang}): {b.marker[1]}")
            continue
        if b.marker:
            print(f"run without the lines beginning {b.marker[1]}: {b.where}")
        code = _code(b, server)
        if b.lang in ("bash", "sh"):
            r = _run(["bash", "-c", _bash(code)], cwd, env)
            assert r.returncode == 0, (b.where, code, r.stdout[-3000:], r.stderr[-3000:])
        elif b.lang == "console":
            for cmd, shown in _console(code):
                r = _run(["bash", "-c", cmd], cwd, env)
                real = (r.stdout + r.stderr).splitlines()
                missing = _shown_in(shown, real)
                assert missing is None, (f"{b.where}: `{cmd}` printed no line like the docs' {missing!r}",
                                         "\n".join(real))
        ran.append(b)
    py = [b for b in ran if b.lang == "python"]
    if py:
        r = _run([sys.executable, "-c", python_script(py, server)], cwd, env)
        assert r.returncode == 0, (doc.name, r.stdout[-3000:], r.stderr[-3000:])
        printed = r.stdout.splitlines()
        for pattern in PRINTED.get(doc.name, []):  # what the blocks' comments say they print, a line each
            hit = next((i for i, ln in enumerate(printed) if re.search(pattern, ln)), None)
            assert hit is not None, (doc.name, pattern, r.stdout[-3000:])
            del printed[hit]
    for name in WRITTEN.get(doc.name, []):
        assert (cwd / name).exists(), f"{doc.name}: its snippets should have written {name}"
    # every runnable block either ran or said why not
    assert len(ran) + len(skipped) == len(mine)


def test_shown_lines_matching_can_fail():
    real = ["seed: FAIL  (loss 9, float64, cpu)", "  symbolic oracle: ok (6 elements, 0.353 s)", "  memory: a b c"]
    assert _shown_in(["seed: FAIL (loss 9, float64, cpu)", "symbolic oracle: ok (6 elements, 0.00164 s)"], real) is None
    assert _shown_in(["seed: FAIL (loss 9, float64, cpu)", "..."], real) is None
    assert _shown_in(["symbolic oracle: ok ...", "memory: a ..."], real) is None
    assert _shown_in(["seed: FAIL (loss 9, float64, cpu)", "memory: a b c"], real) == "memory: a b c"  # a gap
    assert _shown_in(["seed: PASS (loss 9, float64, cpu)"], real) == "seed: PASS (loss 9, float64, cpu)"


def _run_synthetic(tmp_path, body: str):
    doc = tmp_path / "synthetic.md"
    doc.write_text(body)
    py = [b for b in doc_blocks(doc) if b.lang == "python"]
    return py, _run([sys.executable, "-c", python_script(py, None)], tmp_path, None)


def test_a_block_using_an_earlier_blocks_names_fails_unless_it_continues(tmp_path):
    """Issue 44 item 3: each python block runs as pasted alone; only a marked block sees the one before it."""
    first = "```python\nimport math\nr = 2.0\n```\n\nThen:\n\n"
    second = "```python\nprint('area', math.pi * r ** 2)\n```\n"
    py, r = _run_synthetic(tmp_path, first + second)
    assert [b.continues for b in py] == [False, False]
    assert r.returncode != 0 and "NameError" in r.stderr and py[1].where == "synthetic.md:8" in r.stderr, r.stderr
    py, r = _run_synthetic(tmp_path, first + "<!-- continues: the radius above -->\n" + second)
    assert [b.continues for b in py] == [False, True]
    assert r.returncode == 0 and r.stdout.startswith("area 12.566"), r.stderr
    # a third, unmarked block starts afresh again: the chain does not leak past it
    py, r = _run_synthetic(tmp_path, first + "<!-- continues: the radius above -->\n" + second + "\n" + second)
    assert r.returncode != 0 and "NameError" in r.stderr and py[2].where == "synthetic.md:13" in r.stderr, r.stderr
    with pytest.raises(AssertionError, match="no python block before it"):
        python_script(doc_blocks(tmp_path / "synthetic.md")[1:2], None)


def test_json_blocks_that_name_an_example_file_show_it_as_it_is():
    import json

    shown = 0
    for b in BLOCKS:
        if b.lang != "json":
            continue
        text = b.doc.read_text()
        before = text[:text.index(f"```json\n{b.code}")].rstrip().splitlines()[-1]
        m = re.match(r"`(examples/\S+\.json)`", before)  # a paragraph that opens with the file's name
        if m:
            assert json.loads(b.code) == json.loads((ROOT / m.group(1)).read_text()), b.where
            shown += 1
    assert shown >= 1  # README's seed.json


def _part_of(shown, real) -> bool:
    if isinstance(shown, dict):
        if isinstance(real, dict):
            return all(k in real and _part_of(v, real[k]) for k, v in shown.items())
        return isinstance(real, list) and any(_part_of(shown, item) for item in real)
    return shown == real


def _within(shown, real) -> bool:
    """`shown` is part of `real` or of a value nested anywhere in it (the docs show a finding, a node)."""
    children = real.values() if isinstance(real, dict) else real if isinstance(real, list) else []
    return _part_of(shown, real) or any(_within(shown, c) for c in children)


def test_json_blocks_marked_output_of_are_part_of_that_output(reader):
    import json

    cwd, env = reader
    marked = [b for b in BLOCKS if b.marker and b.marker[0] == "output-of"]
    assert len(marked) >= 2  # diagnosis.md's finding, symbolic.md's expr node
    for b in marked:
        r = _run(["bash", "-c", b.marker[1]], cwd, env)
        assert _within(json.loads(b.code), json.loads(r.stdout)), (b.where, b.marker[1], r.stdout[-3000:])


def test_part_of_can_fail():
    real = {"findings": [{"node": "a", "cause": "x"}, {"node": "b"}], "verdict": "fail"}
    assert _part_of({"node": "b"}, real["findings"]) and _part_of({"verdict": "fail"}, real)
    assert not _part_of({"node": "a", "cause": "y"}, real) and not _part_of({"verdict": "pass"}, real)
    assert _within({"node": "a", "cause": "x"}, real) and not _within({"node": "a", "cause": "y"}, real)
