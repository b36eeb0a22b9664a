"""The graph of a finite-difference split decoded once and kept beside its shards (verify/fd_graph.py), in process:
its key, the read-back, a damaged copy and the merge that only reads."""
from gradcheck.v1 import graph_pb2

from gradcheck_svc.verify.fd_graph import PREFIX, decoded, graph_key


def _graph(name: str) -> graph_pb2.Graph:
    g = graph_pb2.Graph()
    g.name = name
    return g


def test_the_key_separates_its_parts():
    assert graph_key(b"ab", b"c") != graph_key(b"a", b"bc")
    assert graph_key(b"ab", b"c") == graph_key(b"ab", b"c")


def test_decoded_once_then_read_and_a_damaged_copy_decoded_again(tmp_path):
    calls = []

    def decode(name="g"):
        calls.append(name)
        return _graph(name)

    key = graph_key(b"model bytes")
    assert decoded(tmp_path, key, graph_pb2.Graph, decode, write=True).name == "g"
    [kept] = tmp_path.glob(f"{PREFIX}*.pb")
    # a later process reads it: the decoder is not called
    assert decoded(tmp_path, key, graph_pb2.Graph, lambda: decode("other"), write=True).name == "g"
    assert calls == ["g"]
    # a damaged copy (its digest no longer matches) is decoded again, never read as a graph
    data = bytearray(kept.read_bytes())
    data[-1] ^= 0xFF
    kept.write_bytes(bytes(data))
    assert decoded(tmp_path, key, graph_pb2.Graph, lambda: decode("again"), write=True).name == "again"
    # another key (another file, flag or version) never reads this one
    assert decoded(tmp_path, graph_key(b"other bytes"), graph_pb2.Graph, lambda: decode("new"), write=False).name \
        == "new"


def test_the_merge_only_reads(tmp_path):
    out = tmp_path / "fd"
    assert decoded(out, graph_key(b"m"), graph_pb2.Graph, lambda: _graph("g"), write=False).name == "g"
    assert not out.exists()
