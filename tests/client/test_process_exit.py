"""gradcheck_core/process_exit.py: a command's end without the interpreter's teardown keeps what an exit does --
the exit code, stdout's buffered text written out, the atexit handlers run -- and takes the usual exit where
another thread still runs (an exit waits for it). Each case runs in a forked child of the test process
(milliseconds: no fresh interpreter)."""
from __future__ import annotations

import os
import sys
import threading

from gradcheck_core.process_exit import exit_now


def _in_child(body) -> tuple[int, bytes]:
    """body() in a forked child whose stdout is a pipe: (its exit code, what it wrote)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test process's stack
        code = 99
        try:
            import atexit

            atexit._clear()  # the test process's handlers are not this child's to run
            os.close(read)
            os.dup2(write, 1)
            sys.stdout = os.fdopen(1, "w", buffering=1 << 20)  # a large buffer: nothing written until a flush
            body()
        except SystemExit as exc:  # the usual exit's way: said by its own code
            code = 100 + (exc.code or 0)
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        out = fh.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


def test_the_exit_code_the_buffered_output_and_the_atexit_handlers():
    def body():
        import atexit

        atexit.register(lambda: print("handler ran"))
        print('{"verdict": "pass"}')
        exit_now(3)

    code, out = _in_child(body)
    assert code == 3  # os._exit's, not SystemExit's (that would read 103)
    assert out == b'{"verdict": "pass"}\nhandler ran\n'


def test_another_thread_running_takes_the_usual_exit():
    def body():
        threading.Thread(target=threading.Event().wait, args=(5,), daemon=True).start()
        exit_now(1)

    code, _ = _in_child(body)
    assert code == 101  # SystemExit(1): the interpreter's exit, which waits for non-daemon threads
