"""Opens a page in headless Chromium over the DevTools protocol: what loaded, what the console
said, which requests left the page, and a full-page screenshot.

Chromium comes from the distribution's packages (``scripts/install_chromium.sh``); the
protocol is spoken with ``websockets``, already in the environment, so no browser driver or
downloaded browser build is needed.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install_chromium.sh"
START_TIMEOUT_S = 60
PAGE_TIMEOUT_S = 60


def chromium_path() -> str:
    """The Chromium binary, installed by the project's script when missing."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


@dataclasses.dataclass
class PageVisit:
    errors: list[str]  # console errors, uncaught exceptions, browser log errors
    requests: list[str]  # every URL the page asked for
    facts: Any  # what the page's ``probe`` expression returned
    screenshot: bytes  # PNG of the whole page


class _Session:
    def __init__(self, url: str):
        self.socket = connect(url, max_size=None, open_timeout=START_TIMEOUT_S)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, **params: Any) -> dict:
        call_id = next(self.ids)
        self.socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=PAGE_TIMEOUT_S))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, method: str) -> None:
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(
                self.socket.recv(timeout=max(0.1, deadline - time.monotonic()))))


def _errors(events: list[dict]) -> list[str]:
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append(" ".join(str(a.get("value", a.get("description")))
                                  for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            found.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(params["entry"]["text"])
    return found


def visit(page: Path, probe: str, profile_dir: Path, width: int = 1280) -> PageVisit:
    """Loads ``page`` in a fresh headless Chromium with the network switched off."""
    process = subprocess.Popen(
        [chromium_path(), "--headless", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--disable-extensions", "--remote-debugging-port=0",
         f"--user-data-dir={profile_dir}", "--host-resolver-rules=MAP * ~NOTFOUND",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
            targets = json.loads(response.read())
        target = next(t for t in targets if t["type"] == "page")
        session = _Session(target["webSocketDebuggerUrl"])
        for domain in ("Runtime", "Log", "Page", "Network"):
            session.call(f"{domain}.enable")
        session.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                     deviceScaleFactor=1, mobile=False)
        session.call("Page.navigate", url=page.resolve().as_uri())
        session.wait_for("Page.loadEventFired")
        facts = session.call("Runtime.evaluate", expression=probe,
                             returnByValue=True)["result"].get("value")
        size = session.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = session.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                            clip={"x": 0, "y": 0, "width": width,
                                  "height": size["height"], "scale": 1})
        requests = [e["params"]["request"]["url"] for e in session.events
                    if e.get("method") == "Network.requestWillBeSent"]
        session.socket.close()
        return PageVisit(_errors(session.events), requests, facts,
                         base64.b64decode(shot["data"]))
    finally:
        process.terminate()
        process.wait(timeout=30)
