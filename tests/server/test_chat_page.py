"""The chat page in headless Chromium (Debian's `chromium`), driven over the DevTools protocol:
type a message, press Enter, watch the answer grow as it streams. Skips when chromium is absent
(scripts/install_deps.sh installs it)."""
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest
import requests

websocket = pytest.importorskip("websocket")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


class Page:
    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r["result"].get("value")


@pytest.fixture()
def browser():
    profile = tempfile.mkdtemp(prefix="kiln-chromium-")
    # --disable-dev-shm-usage: containers often have a tiny /dev/shm, which crashes the renderer.
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-dev-shm-usage",
                             "--disable-extensions", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = pathlib.Path(profile) / "DevToolsActivePort"
    t0 = time.time()
    while not port_file.exists() or not port_file.read_text().strip():
        if time.time() - t0 > 30 or proc.poll() is not None:
            proc.kill()
            pytest.fail("chromium did not start its DevTools endpoint")
        time.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    targets = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
    page = Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
    yield page
    page.ws.close()
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(profile, ignore_errors=True)


def test_chat_page_streams(server, browser):
    browser.call("Page.enable")
    browser.call("Page.navigate", url=server.url + "/")
    t0 = time.time()
    while browser.eval("document.readyState") != "complete" or browser.eval("document.getElementById('model').textContent") in (None, "…"):
        assert time.time() - t0 < 20, "the page did not load"
        time.sleep(0.05)
    assert browser.eval("document.getElementById('model').textContent") == "smollm2"
    browser.eval("document.getElementById('max_tokens').value = 40; document.getElementById('input').focus()")
    browser.call("Input.insertText", text="Write a short poem about a kiln.")
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                     nativeVirtualKeyCode=13)
    lengths = []
    t0 = time.time()
    while True:
        state = browser.eval("(document.querySelector('.msg.assistant, .msg.error') || {dataset: {}}).dataset.state")
        n = browser.eval("(document.querySelector('.msg.assistant') || {textContent: ''}).textContent.length")
        if n and (not lengths or lengths[-1] != n):
            lengths.append(n)
        if state in ("done", "error"):
            break
        assert time.time() - t0 < 60, "no answer in 60 s"
        time.sleep(0.01)
    assert state == "done", browser.eval("document.querySelector('.msg.error').textContent")
    assert browser.eval("document.querySelector('.msg.user').textContent") == "Write a short poem about a kiln."
    assert lengths and lengths[-1] > 0
    assert len(lengths) >= 3, f"the answer did not stream (lengths seen: {lengths})"
    stats = browser.eval("document.querySelector('.stats').textContent")
    assert "tokens/s" in stats, stats
    shot = os.environ.get("KILN_CHAT_SCREENSHOT")
    if shot:
        import base64
        pathlib.Path(shot).write_bytes(base64.b64decode(browser.call("Page.captureScreenshot")["data"]))
