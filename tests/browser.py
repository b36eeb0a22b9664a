"""Headless Chromium for the HTML report's tests, driven over the DevTools protocol.

`chromium()` finds Debian's chromium, installing it (and Graphviz) with apt-get under a timeout
when it is missing; it returns None with the reason when it cannot be had. `open_page()` loads a
file and collects every console error and uncaught exception while it loads; the page object
evaluates JavaScript and takes screenshots.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

APT_TIMEOUT_S = 900
_INSTALL_TRIED: dict[str, str | None] = {}


def ensure_apt(binary: str, package: str) -> str | None:
    """The path of `binary`, installing Debian's `package` first when it is missing (as root, with a
    timeout); None when it cannot be installed here."""
    if shutil.which(binary):
        return shutil.which(binary)
    if package not in _INSTALL_TRIED:
        why = None
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            why = "not root or no apt-get"
        else:
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            try:
                for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=APT_TIMEOUT_S, env=env)
                    if r.returncode != 0:
                        why = f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}"
                        break
            except subprocess.TimeoutExpired:
                why = f"apt-get took over {APT_TIMEOUT_S} s"
        _INSTALL_TRIED[package] = why
    return shutil.which(binary)


def chromium() -> tuple[str | None, str]:
    path = ensure_apt("chromium", "chromium")
    return path, "" if path else f"Debian's chromium could not be installed: {_INSTALL_TRIED.get('chromium')}"


class Page:
    def __init__(self, ws, proc, profile):
        self.ws, self.proc, self.profile = ws, proc, profile
        self._id = 0
        self.errors: list[str] = []

    def send(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                           for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        self.last_event = method

    def wait_for(self, event: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        self.ws.settimeout(timeout)
        while time.monotonic() < end:
            msg = json.loads(self.ws.recv())
            self._event(msg)
            if msg.get("method") == event:
                return
        raise TimeoutError(event)

    def evaluate(self, expression: str):
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"])
        return r["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def open_page(binary: str, url: str, timeout: float = 60) -> Page:
    import websocket

    profile = tempfile.mkdtemp(prefix="gradcheck-chromium-")
    proc = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,900",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + timeout
    port = None
    while port is None and time.monotonic() < end:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        port = int(m.group(1)) if m else None
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
    page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
    page = Page(websocket.create_connection(page_ws, timeout=timeout, suppress_origin=True), proc, profile)
    for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
        page.send(domain)
    page.send("Page.navigate", url=url)
    page.wait_for("Page.loadEventFired", timeout)
    return page
