"""A headless Chromium for the HTML report's tests, driven over the DevTools protocol.

No Python dependency: Chromium started with ``--remote-debugging-pipe`` reads protocol
messages on its fd 3 and writes its answers on fd 4, each a JSON object ending in a NUL byte.

    browser = Browser.start(find_chromium(), tmp_dir)
    page = browser.open(Path("report.html").resolve().as_uri())
    page.evaluate("document.title")
    page.click("th[data-key=calls]")      # a real mouse click at the element's centre
    page.errors                          # console errors and uncaught exceptions so far
    browser.close()

``find_chromium()`` looks at ``CUDATIMER_CHROMIUM``, then ``chromium``, ``chromium-browser``,
``google-chrome`` and ``google-chrome-stable`` on PATH; None when there is none (the tests
then skip, saying how to install one: ``apt-get install -y chromium`` on Debian).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = (
    "no Chromium found: apt-get install -y chromium (Debian), or set CUDATIMER_CHROMIUM to a "
    "Chromium or Chrome executable"
)
# A cold start on a loaded 2-core machine took ~2 s; every call waits at most this long.
TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    """The Chromium executable to use, or None."""
    given = os.environ.get("CUDATIMER_CHROMIUM")
    if given:
        return shutil.which(given)
    return next((found for name in NAMES if (found := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """The browser answered with an error, died, or did not answer in time."""


class Browser:
    """One Chromium process and its protocol pipe."""

    def __init__(
        self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int, log: Path
    ) -> None:
        self.proc = proc
        self._out = to_browser
        self._in = from_browser
        self._log = log
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []  # every event received, in order

    @classmethod
    def start(cls, executable: str, folder: Path) -> Browser:
        """Start ``executable`` headless with a fresh profile under ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        # Our ends of two pipes; the browser's ends become its fds 3 (commands in) and 4
        # (answers out). They are first moved to fds >= 10 so that placing them at 3 and 4 in
        # the child cannot overwrite one with the other.
        cmd_r, cmd_w = os.pipe()
        ans_r, ans_w = os.pipe()
        child_in = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(ans_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(cmd_r)
        os.close(ans_w)

        def place_fds() -> None:
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        args = [
            executable,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",  # as root, and in containers, the sandbox cannot start
            "--disable-gpu",
            "--disable-dev-shm-usage",  # a container's /dev/shm is often 64 MB
            "--disable-extensions",
            "--disable-background-networking",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={folder / 'profile'}",
            "--window-size=1280,900",
            "about:blank",
        ]
        log = folder / "chromium.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                pass_fds=(3, 4),
                preexec_fn=place_fds,  # runs between fork and exec: dup2 only
            )
        os.close(child_in)
        os.close(child_out)
        return cls(proc, cmd_w, ans_r, log)

    # -- the protocol ---------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer from Chromium in time{self._log_tail()}")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium closed its pipe{self._log_tail()}")
                self._buf += chunk
        message, self._buf = self._buf.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def _log_tail(self) -> str:
        try:
            tail = self._log.read_text(errors="replace")[-2000:]
        except OSError:
            tail = ""
        return f" (exit status {self.proc.poll()}); its log ends:\n{tail}" if tail else ""

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and wait for its answer (events that arrive meanwhile are kept in
        ``events``); a BrowserError carries the protocol's error."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            got = self._read_message(deadline)
            if got.get("id") == self._next_id:
                if "error" in got:
                    raise BrowserError(f"{method}: {got['error']}")
                result: dict[str, Any] = got.get("result", {})
                return result
            if "method" in got:
                self.events.append(got)

    def wait_for(self, method: str, session: str, since: int) -> dict[str, Any]:
        """The first event ``method`` of ``session`` at or after ``events[since]``."""
        deadline = time.monotonic() + TIMEOUT_S
        i = since
        while True:
            while i < len(self.events):
                event = self.events[i]
                if event["method"] == method and event.get("sessionId") == session:
                    return event
                i += 1
            got = self._read_message(deadline)
            if "method" in got:
                self.events.append(got)

    def open(self, url: str) -> Page:
        """A new tab that has loaded ``url`` (its load event fired)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        page = Page(self, session, len(self.events))
        mark = len(self.events)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session, mark)
        return page

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):  # it may be gone already
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._out, self._in):
            os.close(fd)


class Page:
    """One tab, attached through a protocol session."""

    def __init__(self, browser: Browser, session: str, first_event: int) -> None:
        self.browser = browser
        self.session = session
        self._first = first_event

    def _events(self, method: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.browser.events[self._first :]
            if e["method"] == method and e.get("sessionId") == self.session
        ]

    @property
    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error log entries (e.g. a refused
        script or a failed load) seen in this tab so far."""
        self.evaluate("0")  # lets events that are on their way arrive
        found = [
            json.dumps(e["params"]["exceptionDetails"])[:2000]
            for e in self._events("Runtime.exceptionThrown")
        ]
        found += [
            json.dumps(e["params"]["args"])[:2000]
            for e in self._events("Runtime.consoleAPICalled")
            if e["params"]["type"] in ("error", "assert")
        ]
        found += [
            e["params"]["entry"].get("text", "")
            for e in self._events("Log.entryAdded")
            if e["params"]["entry"]["level"] == "error"
        ]
        return found

    @property
    def requests(self) -> list[str]:
        """The URL of every request this tab made (the page's own file included)."""
        return [e["params"]["request"]["url"] for e in self._events("Network.requestWillBeSent")]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        got = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
        )
        if "exceptionDetails" in got:
            raise BrowserError(f"{expression!r} threw: {got['exceptionDetails']}")
        return got["result"].get("value")

    def click(self, selector: str) -> None:
        """Press and release the left mouse button over the centre of the first element
        matching ``selector`` (scrolled into view), as a user would."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if box is None:
            raise BrowserError(f"nothing matches {selector!r}")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            params = {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
            if kind == "mouseMoved":
                params = {"type": kind, "x": x, "y": y}
            self.browser.send("Input.dispatchMouseEvent", params, session=self.session)
