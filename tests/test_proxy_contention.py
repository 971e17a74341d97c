"""``proxy.contention``: the kernel's count of runnable tasks, read as the recorder process reads
it, and the deferral that bounds how long it steps aside."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy.contention import CpuContention, Deferral


def _loadavg(tmp_path: Path, text: str) -> str:
    path = tmp_path / "loadavg"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "waiting"),
    [
        ("0.52 0.91 1.40 3/105 32580\n", True),  # 3 runnable, 2 CPUs: one waits
        ("0.52 0.91 1.40 2/105 32580\n", False),  # one per CPU (the caller one of them)
        ("0.52 0.91 1.40 1/105 32580\n", False),
    ],
)
def test_tasks_wait_when_more_can_run_than_there_are_cpus(tmp_path: Path, text: str, waiting: bool) -> None:
    assert CpuContention(_loadavg(tmp_path, text), cpus=2).waiting() is waiting


def test_an_unreadable_or_strange_count_never_makes_anyone_wait(tmp_path: Path) -> None:
    assert CpuContention(str(tmp_path / "missing"), cpus=1).waiting() is False
    strange = CpuContention(_loadavg(tmp_path, "no numbers here\n"), cpus=1)
    assert strange.waiting() is False
    (tmp_path / "loadavg").write_text("0.1 0.1 0.1 9/100 1\n")
    assert strange.waiting() is False  # given up on for good: no retries on every check


def test_the_kernel_says_so_while_more_tasks_spin_than_there_are_cpus() -> None:
    """Real processes on this machine: one more busy than it has CPUs, and the count shows it."""
    contention = CpuContention()
    spin = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass\n"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(contention.cpus + 1)]
    try:
        seen = False
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            seen = contention.waiting()
            time.sleep(0.01)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)
    assert seen


class _Always:
    """Someone always waits."""

    cpus = 1

    def waiting(self) -> bool:
        return True


class _Never:
    cpus = 1

    def waiting(self) -> bool:
        return False


def test_deferral_sleeps_while_others_wait_within_its_allowance() -> None:
    """A burst of ``burst`` seconds, then ``share`` of the time that passes."""
    clock = [100.0]
    deferral = Deferral(_Always(), step=0.001, share=0.1, burst=0.005, clock=lambda: clock[0])  # type: ignore[arg-type]
    start = time.monotonic()
    deferral.pause_while_waiting()
    assert time.monotonic() - start >= 0.005
    assert deferral.take() == pytest.approx(0.005) and deferral.take() == 0
    assert deferral.pause() is False  # spent: the work goes on
    clock[0] += 0.02  # 2 ms of allowance back at a share of 0.1
    deferral.pause_while_waiting()
    assert deferral.take() == pytest.approx(0.002)
    clock[0] += 1000.0  # never more than the burst
    deferral.pause_while_waiting()
    assert deferral.take() == pytest.approx(0.005)


def test_deferral_never_sleeps_when_nobody_waits() -> None:
    deferral = Deferral(_Never(), step=1.0, share=1.0, burst=10.0)  # type: ignore[arg-type]
    deferral.pause_while_waiting()
    assert deferral.pause() is False and deferral.take() == 0


def test_a_pause_costs_the_wait_to_run_again_too() -> None:
    """An idle-class process on a busy machine may wait long for a CPU after its sleep: the
    allowance pays for that wait, so it cannot keep giving up the CPU it seldom gets."""
    ticks = iter(range(0, 10_000, 4))  # each look at the clock: 4 ms later
    deferral = Deferral(_Always(), step=0.001, share=0.0, burst=0.010, clock=lambda: next(ticks) / 1000)  # type: ignore[arg-type]
    deferral.pause_while_waiting()
    assert deferral.take() == pytest.approx(0.012)  # 3 pauses of 4 ms: the 10 ms allowance spent


def test_long_waits_to_run_again_mean_no_slack_for_a_while() -> None:
    """An occasional slow pause is the noise of a machine with slack (1.1% of them under the
    200-connection bench); a run of them says it has none (31% under a bulk load)."""
    clock, cost = [0.0], [0.006]

    def costly_clock() -> float:
        clock[0] += cost[0]  # each look: that much later, so a pause takes that long
        return clock[0]

    deferral = Deferral(_Always(), step=0.001, share=0.5, burst=1.0, clock=costly_clock)  # type: ignore[arg-type]
    assert deferral.pause() is True  # slow (6 ms, above saturated_after) ...
    cost[0] = 0.001
    assert all(deferral.pause() for _ in range(20))  # ... and no sign alone
    cost[0] = 0.006
    assert deferral.pause() is True and deferral.pause() is True  # two more slow ones ...
    assert deferral.pause() is True and deferral.pause() is False  # ... and a third: none now
    clock[0] += 0.9  # less than back_off: still none
    assert deferral.pause() is False
    clock[0] += 0.5
    assert deferral.pause() is True
