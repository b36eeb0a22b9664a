"""Hostile --claimed archives (gradcheck_core/npz_bounded.py): every archive is bounded before it is
inflated, and whatever the reader cannot take is exit 2 with one line naming the file and the member,
through `gradcheck-svc verify`, `gradcheck verify` in process and `gradcheck verify --server` (which reads
the archive before it connects). Real files; real processes where a process is what is tested (the zip bomb
under a 200 MB address space, the gRPC front end), the in-process commands forked (tests/forked_cli.py)."""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest

import forked_cli
from conftest import EXAMPLES
from gradcheck_core.npz_bounded import NpzError, read_npz

SEED = str(EXAMPLES / "seed.json")  # parameters w and x, scalars
COMMANDS = {"svc": [sys.executable, "-m", "gradcheck_svc.cli", "verify", SEED],
            "client": [sys.executable, "-m", "gradcheck_client.cli", "verify", SEED],
            "server": [sys.executable, "-m", "gradcheck_client.cli", "verify", SEED, "--server", "127.0.0.1:9"]}
AS_CAP = 200 * 2**20


def _npy_header(shape, descr="<f8") -> bytes:
    """An .npy 1.0 header as np.save writes it (padded to 64 bytes, newline-terminated)."""
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def _deflated(head: bytes, zero_mib: int) -> bytes:
    """Raw deflate of `head` then zero_mib MiB of zeros, made from one 1 MiB block repeated (after a full
    flush a block depends on nothing before it): ~1 KB per MiB, in milliseconds."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(2**20)) + c.flush(zlib.Z_FULL_FLUSH)
    return out + block * zero_mib + zlib.compressobj(9, zlib.DEFLATED, -15).flush()


def _write_zip(path, members) -> None:
    """A zip of deflated members (name, deflate data, crc, declared size) written by hand: the directory
    says what the test wants it to say, not what the data is."""
    body, central = io.BytesIO(), io.BytesIO()
    for name, data, crc, size in members:
        offset, raw = body.tell(), name.encode()
        fields = (20, 0, 8, 0, 0, crc, len(data), size, len(raw), 0)
        body.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", *fields) + raw + data)
        central.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, *fields[:-1], 0, 0, 0, 0, 0, offset) + raw)
    cd = central.getvalue()
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(cd), body.tell(), 0)
    path.write_bytes(body.getvalue() + cd + eocd)


def _run(cmd, path, *flags, cap=False):
    """(exit code, stdout, stderr) of a front end. Capped (a fresh process's address space) or talking gRPC: a
    real process; else the in-process command in a fork of this one (tests/forked_cli.py: its main, environment,
    pipes and exit status)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if not cap and cmd != "server":
        p = forked_cli.run(COMMANDS[cmd][2], *COMMANDS[cmd][3:], "--claimed", path, *flags, env=env, timeout=300)
        return p.returncode, p.stdout, p.stderr

    def limit_memory():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))

    p = subprocess.run([*COMMANDS[cmd], "--claimed", str(path), *flags], capture_output=True, text=True,
                       timeout=300, env=env, preexec_fn=limit_memory if cap else None)
    return p.returncode, p.stdout, p.stderr


def _one_line_refusal(code, out, err, *words):
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err and not out.strip()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ---- the zip bomb: ~300 KB of deflate, 300 MiB of zeros, a header and a directory declaring 2 GiB --------

@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    d = tmp_path_factory.mktemp("bomb")
    head = _npy_header((2**28,))  # 2 GiB of float64
    data = _deflated(head, 300)
    _write_zip(d / "bomb.npz", [("w.npy", data, 0, len(head) + 2**31)])
    assert (d / "bomb.npz").stat().st_size < 400_000
    # the directory (and header) honest about 4 values while the deflate stream goes on for 300 MiB: the
    # reader stops where the directory says the member ends
    small = _npy_header((4,))
    crc = zlib.crc32(small + bytes(32))
    _write_zip(d / "long_stream.npz", [("w.npy", _deflated(small, 300), crc, len(small) + 32)])
    return d


@pytest.mark.parametrize("cmd", ["svc", "client", "server"])
def test_a_zip_bomb_is_refused_in_one_line_under_a_200_mb_address_space(cmd, bomb):
    code, out, err = _run(cmd, bomb / "bomb.npz", cap=True)
    _one_line_refusal(code, out, err, str(bomb / "bomb.npz"), "max_message_bytes")


def test_the_bomb_is_refused_from_the_header_when_the_request_limit_would_take_it(bomb):
    # with a limit large enough for the directory's 2 GiB, the header's 2**28 elements meet max_elements
    code, out, err = _run("svc", bomb / "bomb.npz", "--max-message-bytes", str(2**32), cap=True)
    _one_line_refusal(code, out, err, "member 'w.npy'", "268435456 elements", "max_elements")


def test_inflating_stops_where_the_member_ends_whatever_the_stream_holds(bomb):
    script = ("import sys; from gradcheck_core.npz_bounded import read_npz; "
              "a = read_npz(sys.argv[1], 100, 2**20); print(a['w'].tolist())")

    def limit_memory():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))

    p = subprocess.run([sys.executable, "-c", script, str(bomb / "long_stream.npz")], capture_output=True,
                       text=True, timeout=120, preexec_fn=limit_memory,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 0 and p.stdout.strip() == "[0.0, 0.0, 0.0, 0.0]", p.stderr


def test_a_member_whose_directory_size_is_not_its_headers_is_refused_before_its_data(tmp_path):
    head = _npy_header((4,))
    data = head + bytes(32) + b"\x00" * 64
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    _write_zip(tmp_path / "long.npz", [("w.npy", c.compress(data) + c.flush(), zlib.crc32(data), len(data))])
    with pytest.raises(NpzError, match=r"member 'w.npy': the zip directory says 224 bytes, its .npy header 128 \+ 32 of data"):
        read_npz(tmp_path / "long.npz", 100, 2**20)


# ---- malformed archives: exit 2, one line naming the file and the member ---------------------------------

def _archive(path, members: dict) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


MALFORMED = {
    "not_npy_member": ({"w.txt": b"6.0"}, "member 'w.txt': not an .npy array"),
    "no_magic": ({"w.npy": b"just bytes, no magic"}, "member 'w.npy': not an .npy array"),
    "bad_header": ({"w.npy": b"\x93NUMPY\x01\x00" + struct.pack("<H", 20) + b"{'descr': (((((((  \n"},
                   "member 'w.npy': not an .npy array"),
    "call_in_header": ({"w.npy": _npy_header((1,)).replace(b"'<f8'", b"__import__('os').system('false')")},
                       "member 'w.npy': not an .npy array"),
    "object_dtype": ({"w.npy": _npy_header((1,), "|O") + bytes(8)}, "member 'w.npy': holds object values"),
    "complex_dtype": ({"w.npy": _npy_header((1,), "<c16") + bytes(16)}, "member 'w.npy': holds complex128 values"),
    "declares_50_gb": ({"w.npy": _npy_header((50 * 2**30 // 8,))}, "member 'w.npy': declares shape [6710886400]"),
    "truncated": ({"w.npy": _npy_header((4,)) + bytes(8)}, "member 'w.npy': the zip directory says 136 bytes"),
    "version_9": ({"w.npy": b"\x93NUMPY\x09\x00" + _npy_header((1,))[8:] + bytes(8)},
                  "member 'w.npy': not an .npy array"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_member_is_one_line_naming_file_and_member(case, tmp_path):
    members, words = MALFORMED[case]
    path = tmp_path / f"{case}.npz"
    _archive(path, members)
    with pytest.raises(NpzError) as info:
        read_npz(path, 10_000_000, 16 * 2**20)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("cmd", ["svc", "client", "server"])
def test_malformed_archives_exit_2_in_one_line_through_every_front_end(cmd, tmp_path):
    for case in ("not_npy_member", "bad_header", "declares_50_gb"):
        members, words = MALFORMED[case]
        path = tmp_path / f"{case}.npz"
        _archive(path, members)
        _one_line_refusal(*_run(cmd, path), str(path), words)


@pytest.mark.parametrize("cmd", ["svc", "client", "server"])
def test_a_fifo_is_refused_at_once_not_waited_on(cmd, tmp_path):
    fifo = tmp_path / "grads.npz"
    os.mkfifo(fifo)  # nobody ever writes to it: opening it for reading the usual way would wait for ever
    _one_line_refusal(*_run(cmd, fifo), str(fifo), "not a regular file (a FIFO)")


def test_a_device_and_a_directory_are_refused(tmp_path):
    for path, kind in (("/dev/zero", "a device"), (tmp_path, "a directory")):
        with pytest.raises(NpzError, match=rf"not a regular file \({kind}\)"):
            read_npz(path, 10, 100)


def test_the_archive_np_savez_writes_still_reads_exactly(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4).astype(np.float32),
              "adjoint:h": np.asfortranarray(rng.standard_normal((2, 5))), "n": np.arange(6, dtype=np.int16)}
    np.savez(tmp_path / "plain.npz", **arrays)
    np.savez_compressed(tmp_path / "packed.npz", **arrays)
    for name in ("plain.npz", "packed.npz"):
        got = read_npz(tmp_path / name, 1000, 2**20)
        assert sorted(got) == sorted(arrays)
        for k, v in arrays.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v)


def test_limits_count_what_the_request_carries(tmp_path):
    np.savez(tmp_path / "g.npz", w=np.zeros(100), b=np.zeros(100, np.float32))  # 800 + 400 bytes as sent
    assert sorted(read_npz(tmp_path / "g.npz", 200, 1200)) == ["b", "w"]
    with pytest.raises(NpzError, match="reach 201, over the limit of 200 \\(max_elements\\)"):
        np.savez(tmp_path / "h.npz", w=np.zeros(100), b=np.zeros(101, np.float32))
        read_npz(tmp_path / "h.npz", 200, 2**20)
    with pytest.raises(NpzError, match="reach 1200 bytes in a request, over the limit of 1199"):
        read_npz(tmp_path / "g.npz", 200, 1199)


def test_a_directory_listing_more_members_than_a_request_can_carry_is_refused_before_it_is_read(tmp_path):
    # an end record claiming 2**20 members in a 256 MiB directory: zipfile would read and parse it whole
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 2**28, 0, 0)
    (tmp_path / "many.npz").write_bytes(eocd)
    with pytest.raises(NpzError, match=r"many.npz: its zip directory lists 65535 members in 268435456 bytes, more "
                                       r"than a request of at most 1048576 bytes \(max_message_bytes\) can carry"):
        read_npz(tmp_path / "many.npz", 1000, 2**20)
    np.savez(tmp_path / "few.npz", **{f"p{i}": np.zeros(1) for i in range(64)})
    assert len(read_npz(tmp_path / "few.npz", 1000, 2**20)) == 64
    with pytest.raises(NpzError, match="lists 64 members"):
        read_npz(tmp_path / "few.npz", 1000, 63 * 16)


@pytest.mark.parametrize("module, words", [("gradcheck_svc.cli", "is not a regular file: give a graph file"),
                                           ("gradcheck_client.cli", "not a regular file or directory: ")])
def test_a_fifo_given_as_the_graph_is_refused_at_once(module, words, tmp_path):
    fifo = tmp_path / "graph.json"
    os.mkfifo(fifo)
    p = forked_cli.run(module, "verify", fifo, timeout=300)
    _one_line_refusal(p.returncode, p.stdout, p.stderr, str(fifo), words)
