"""Runs a capture program (tcpdump, dumpcap) and ends it when kwire dies, even by SIGKILL.

    python -I -S capture_guard.py KWIRE_PID PROGRAM [ARG ...]

Why a process of its own: a capture program whose reader is gone notices only when it next
writes a packet (EPIPE), so on a quiet link a ``kwire capture`` or ``kwire decode -i`` killed
with SIGKILL left its tcpdump running for hours. The kernel's parent-death signal
(``PR_SET_PDEATHSIG``) cannot be set on tcpdump itself: it is cleared when tcpdump drops root
for its own user, and when the program has file capabilities. This guard keeps it: it asks
for SIGTERM when kwire (the thread that started it) ends, starts the program as its child in
its own process group, and passes on SIGTERM, SIGINT and SIGHUP to it. It exits with the
program's exit code (128 + N for a signal N, as a shell does), once the program has ended.

The program inherits the guard's stdin, stdout and stderr; the guard then points its own
stdout at /dev/null, so the program's end is the end of kwire's pipe. Standard library only,
run by path with ``-I -S``: it starts in milliseconds and imports nothing of kwire.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: capture_guard.py KWIRE_PID PROGRAM [ARG ...]", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[1:]
    # (not Linux: the program then ends at its next packet, as without the guard)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # kwire died before the prctl: nothing would signal us
        return 0
    child = 0
    early: list[int] = []  # a signal that came before the program started

    def pass_on(signum: int, _frame: object) -> None:
        if not child:
            early.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, pass_on)
    try:
        child = os.posix_spawnp(command[0], command, os.environ)
    except OSError as exc:
        print(f"{os.path.basename(command[0])}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the pipe's write end is the program's alone
    os.close(devnull)
    if early or os.getppid() != parent:  # asked to stop, or kwire died, while it started
        pass_on(early[0] if early else signal.SIGTERM, None)
    try:
        _, status = os.waitpid(child, 0)  # (PEP 475: retried after each signal passed on)
    except ChildProcessError:
        return 0
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
