"""A pcap stream read from a pipe (``kwire decode -``, ``-i``) lets Ctrl-C through while no packet comes.

CI once saw ``kwire decode -i lo`` ignore Ctrl-C on a quiet link for 30 s: its reader sat in a
blocking ``read`` of tcpdump's pipe, and a signal does not interrupt a read when its Python handler
became due just before the read began, or when the kernel handed the signal to another thread.
Both leave the handler waiting for the next packet. The second can be made to happen every time:
here the main thread blocks SIGINT, so the kernel gives it to the process's other thread.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_READER = r"""
import os, signal, struct, sys, threading

from decoder.pcap import CaptureStats, iter_stream_segments

r, w = os.pipe()
os.write(w, struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # a pcap header, then nothing


def handler(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, handler)
threading.Thread(target=threading.Event().wait, daemon=True).start()  # takes SIGINT: made before the mask
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
print("reading", flush=True)
try:
    for _ in iter_stream_segments(os.fdopen(r, "rb"), "-", CaptureStats()):
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
print("ended", flush=True)
"""


def test_ctrl_c_taken_by_another_thread_still_ends_a_read_waiting_for_packets() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _READER], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "reading\n"
        time.sleep(0.5)  # in the read, waiting for a packet that never comes
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert (process.returncode, out) == (3, "interrupted\n"), err
