"""Load a local page in headless Chromium and report what happened: console errors, uncaught
exceptions, every network request, values read from the page, and a full-page screenshot.

Drives Debian's ``chromium`` through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: the browser reads commands on fd 3 and writes answers on fd 4,
NUL-separated JSON), so it needs no port and no Python package. Every wait is bounded; the
browser is stopped by its process group whatever happens.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PageLoad", "chromium_binary", "load_page"]


def chromium_binary() -> str | None:
    """The Chromium executable on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageLoad:
    """What loading a page showed."""

    url: str
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included
    console: list[dict[str, Any]] = field(default_factory=list)  # {level, text}
    exceptions: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # name -> result of the expression
    screenshot: Path | None = None

    @property
    def errors(self) -> list[str]:
        """Console errors and uncaught exceptions."""
        return [c["text"] for c in self.console if c["level"] == "error"] + self.exceptions

    @property
    def external_requests(self) -> list[str]:
        """Requests for anything but the page itself and inline data."""
        return [u for u in self.requests if u != self.url and not u.startswith(("data:", "blob:", "about:"))]


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.to_browser, self.from_browser = proc, to_browser, from_browser
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from chromium")
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(
        self, method: str, params: dict | None = None, *, session: str | None = None, timeout: float = 30
    ):
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_event(self, method: str, timeout: float) -> dict[str, Any]:
        """The first event ``method`` (already received or arriving within ``timeout`` s)."""
        for e in self.events:
            if e.get("method") == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are above fd 4, so that dup2 onto 3 and 4 in the child always copies
    (dup2 of an fd onto itself would keep its close-on-exec flag)."""
    import fcntl

    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return ends[0], ends[1]


def load_page(
    path: str | Path,
    *,
    ready: str = "true",
    values: dict[str, str] | None = None,
    screenshot: str | Path | None = None,
    element_shots: dict[str | Path, str] | None = None,
    width: int = 1280,
    timeout: float = 60.0,
) -> PageLoad:
    """Open ``path`` in headless Chromium, wait until the JavaScript expression ``ready`` is
    true (at most ``timeout`` s), evaluate each of ``values`` (expressions, results as JSON),
    save a full-page PNG to ``screenshot`` and one PNG of the first element matching each CSS
    selector of ``element_shots`` (file -> selector), and return what the page did."""
    binary = chromium_binary()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (scripts/install-system-deps)")
    url = Path(path).resolve().as_uri()
    result = PageLoad(url)
    profile = tempfile.mkdtemp(prefix="kwire-chromium-")
    cmd_read, cmd_write = _high_pipe()  # we write commands, the browser reads fd 3
    ans_read, ans_write = _high_pipe()  # the browser writes fd 4, we read answers

    def child_fds() -> None:
        os.dup2(cmd_read, 3)
        os.dup2(ans_write, 4)

    args = [
        binary,
        "--headless",
        "--remote-debugging-pipe",
        "--no-sandbox",  # root in CI
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_fds,  # dup2 only, before exec
        close_fds=False,  # would close fds 3 and 4 after preexec_fn; Python's own fds are CLOEXEC
        start_new_session=True,
    )
    os.close(cmd_read)
    os.close(ans_write)
    pipe = _Pipe(proc, cmd_write, ans_read)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        pipe.events.clear()
        pipe.send("Page.navigate", {"url": url}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout)

        def evaluate(expression: str) -> Any:
            answer = pipe.send(
                "Runtime.evaluate",
                {"expression": expression, "returnByValue": True, "awaitPromise": True},
                session=session,
                timeout=timeout,
            )
            if "exceptionDetails" in answer:
                raise RuntimeError(f"{expression}: {answer['exceptionDetails'].get('text')}")
            return answer["result"].get("value")

        deadline = time.monotonic() + timeout
        while not evaluate(f"Boolean({ready})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page not ready within {timeout} s: {ready}")
            time.sleep(0.2)
        for name, expression in (values or {}).items():
            result.values[name] = evaluate(expression)
        if screenshot is not None or element_shots:
            # the whole page in one viewport: element boxes then stay where they are captured
            height = int(evaluate("Math.ceil(document.documentElement.scrollHeight)") or 900)
            pipe.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": min(height, 16000), "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
        if screenshot is not None:
            shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=session, timeout=timeout)
            result.screenshot = Path(screenshot)
            result.screenshot.parent.mkdir(parents=True, exist_ok=True)
            result.screenshot.write_bytes(base64.b64decode(shot["data"]))
        for file, selector in (element_shots or {}).items():
            box = evaluate(
                f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                " const r = e.getBoundingClientRect();"
                " return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; })()"
            )
            if not box:
                raise LookupError(f"no element {selector}")
            shot = pipe.send(
                "Page.captureScreenshot",
                {"format": "png", "clip": {**box, "scale": 1}},
                session=session,
                timeout=timeout,
            )
            Path(file).parent.mkdir(parents=True, exist_ok=True)
            Path(file).write_bytes(base64.b64decode(shot["data"]))
        for e in pipe.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                result.console.append(
                    {"level": "error" if params["type"] == "error" else params["type"], "text": text}
                )
            elif method == "Log.entryAdded":
                entry = params["entry"]
                result.console.append({"level": entry["level"], "text": entry.get("text", "")})
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                result.exceptions.append(
                    details.get("exception", {}).get("description") or details.get("text", "exception")
                )
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            pipe.send("Browser.close", timeout=10)
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        else:  # the browser's helpers (renderer, zygote) share its process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        os.close(cmd_write)
        os.close(ans_read)
        shutil.rmtree(profile, ignore_errors=True)
    return result
