"""Headless Chromium driven through the DevTools protocol, for tests of interactive pages.

:func:`browser` starts Debian's ``/usr/bin/chromium`` headless with a DevTools port, opens one
page and yields a :class:`Page`: ``goto(url)``, ``js(expression)`` (the value of a JavaScript
expression, awaited if it is a promise), ``wait_for(expression)`` (until it is truthy) and
``screenshot(path)``. The protocol runs over the page's WebSocket (the ``websockets`` package,
which the ``serve`` extra brings).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


class Page:
    """One browser tab over the DevTools protocol."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0
        self.console: list[str] = []  # console messages and uncaught exceptions, in order

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))
            if msg.get("method") == "Runtime.consoleAPICalled":
                args = msg["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", "")) for a in args))
            elif msg.get("method") == "Runtime.exceptionThrown":
                self.console.append(str(msg["params"]["exceptionDetails"].get("text", "")))

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of ``expression`` in the page (promises awaited)."""
        out = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails'].get('text')}")
        return out.get("result", {}).get("value")

    def wait_for(self, expression: str, limit: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy (its value), or fail after ``limit`` seconds."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"not true within {limit} s: {expression}")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


@contextmanager
def browser(profile: Path, width: int = 1280, height: int = 1600) -> Iterator[Page]:
    """Headless Chromium with one blank page; closed at the end."""
    cmd = [
        str(CHROMIUM),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        port = None
        end = time.monotonic() + 60
        assert proc.stderr is not None
        while port is None and time.monotonic() < end:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError("chromium exited before it opened its DevTools port")
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
        if port is None:
            raise RuntimeError("chromium did not open its DevTools port within 60 s")
        # keep reading its log, so that a chatty browser never blocks on a full pipe
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        with connect(url, max_size=None, open_timeout=30) as ws:
            page = Page(ws)
            page.call("Runtime.enable")
            page.call("Page.enable")
            yield page
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
