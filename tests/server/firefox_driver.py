"""Headless Firefox for the web console's browser tests, driven over Marionette, the remote protocol Firefox
speaks itself (Debian packages no geckodriver), through Mozilla's `marionette-driver` client. `FirefoxDriver`
offers the few Selenium driver methods that scripts/console_screenshots.py's helpers and
tests/server/test_console_browser.py call, so that one test drives Chromium and Firefox alike.

The browser's console is read in Marionette's chrome context (the console service, which holds every script
error, unhandled rejection and CSP report of the page, including those raised while it loads) and handed out
as Selenium's `get_log("browser")` entries. It knows nothing of the console page itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

START_S = 60

# The page's errors since `since` (ms since the epoch): script errors and rejections ("content javascript"),
# CSP refusals and the like, at error level, from content (not the browser's own chrome).
CONSOLE_ERRORS = """
const [since] = arguments;
return Services.console.getMessageArray()
  .filter(m => m instanceof Ci.nsIScriptError && m.logLevel === Ci.nsIConsoleMessage.error)
  .filter(m => !m.isFromChromeContext && m.timeStamp > since)
  .map(m => ({level: "SEVERE", source: m.category, message: `${m.sourceName} ${m.errorMessage}`,
              timestamp: m.timeStamp}));
"""


def firefox_binary() -> str | None:
    return next((p for p in map(shutil.which, ("firefox-esr", "firefox")) if p), None)


def firefox_problem() -> str | None:
    """Why Firefox cannot be driven here (None when Firefox and marionette-driver are both present)."""
    try:
        _marionette()
    except ImportError:
        return "marionette-driver is not installed (pip install 'diffuserve[test]')"
    if firefox_binary() is None:
        return "no Firefox (Debian: apt-get install firefox-esr)"
    return None


def _marionette() -> Any:
    """marionette_driver's client class; its imports' DeprecationWarnings (mozinfo, telnetlib) are theirs, not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from marionette_driver.marionette import Marionette
    return Marionette


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FirefoxDriver:
    """Firefox, headless, on a throwaway profile; `quit` ends every process of it and deletes the profile."""

    def __init__(self, size: tuple[int, int]) -> None:
        Marionette = _marionette()
        self.profile = Path(tempfile.mkdtemp(prefix="diffuserve-firefox-"))
        port = _free_port()
        (self.profile / "user.js").write_text(f'user_pref("marionette.port", {port});\n')
        command = [firefox_binary() or "firefox", "--headless", "--marionette", "--remote-allow-system-access"]
        command += ["--no-remote", "--profile", str(self.profile)]
        # its own process group, so that quit() reaches the content processes too
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            self._wait_for_port(port)
            self.marionette = Marionette(port=port)
            self.marionette.start_session(timeout=START_S)
            with self.marionette.using_context("chrome"):  # the browser window's 500px floor: phones are narrower
                self.marionette.execute_script("document.documentElement.style.minWidth = '0px'")
            self.set_window_size(*size)
        except BaseException:
            self.quit()
            raise
        self._log_since = 0.0

    def _wait_for_port(self, port: int) -> None:
        deadline = time.monotonic() + START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Firefox did not open Marionette on port {port}") from None
                time.sleep(0.1)

    def get(self, url: str) -> None:
        self.marionette.navigate(url)

    def find_element(self, by: str, target: str) -> Any:
        return self.marionette.find_element(by, target)

    def find_elements(self, by: str, target: str) -> list[Any]:
        return list(self.marionette.find_elements(by, target))

    def execute_script(self, script: str, *args: Any) -> Any:
        return self.marionette.execute_script(script, script_args=list(args))

    def set_window_size(self, width: int, height: int) -> None:
        self.marionette.set_window_rect(width=width, height=height)

    def get_log(self, kind: str) -> list[dict[str, Any]]:
        """The console's errors since the last call (Selenium's "browser" log keeps only what is new, too)."""
        assert kind == "browser", kind
        with self.marionette.using_context("chrome"):
            entries = self.marionette.execute_script(CONSOLE_ERRORS, script_args=[self._log_since])
        self._log_since = max([self._log_since, *(e["timestamp"] for e in entries)])
        return list(entries)

    def quit(self) -> None:
        marionette = getattr(self, "marionette", None)
        if marionette is not None and marionette.session is not None:
            with contextlib.suppress(Exception):  # Firefox is ended below, whatever state it is in
                marionette.delete_session()
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the kill reaches content processes left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
