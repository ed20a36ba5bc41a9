"""Chromium driven through the DevTools protocol, and what the dashboard tests read of the tab
in it: the error badges in view, and whether a screenshot shows them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path


class DevTools:
    """Chromium driven through the DevTools protocol over ``--remote-debugging-pipe`` (fds 3, 4)."""

    def __init__(self, chromium: str, profile: Path) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def wire() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes replies
            read, write = os.dup(to_child), os.dup(from_child)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self._process = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--window-size=1400,900", "about:blank"],
            preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        self._session: str | None = None

    def call(self, method: str, params: dict | None = None) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if self._session and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.monotonic() + 60
        while self.evaluate("document.readyState === 'complete' && location.href", retry=True) != url:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load")
            time.sleep(0.1)

    def evaluate(self, expression: str, retry: bool = False) -> object:
        try:
            result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                    "returnByValue": True, "timeout": 60000})
        except RuntimeError:
            if retry:
                return None
            raise
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def close(self) -> None:
        os.close(self._out)
        os.close(self._in)
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)


_VISIBLE_BADGES = """(async () => {
  const until = async (f) => {
    for (let i = 0; i < 300; i++) { const v = f(); if (v) return v; await new Promise((r) => setTimeout(r, 100)); }
    throw new Error("timed out waiting for the tab");
  };
  const frame = await until(() => document.querySelector("iframe"));
  const doc = await until(() => frame.contentDocument && frame.contentDocument.querySelector('.row[data-name="%(row)s"]')
                               && frame.contentDocument);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const origin = frame.getBoundingClientRect();
  const inset = [origin.left + frame.clientLeft, origin.top + frame.clientTop];
  const badges = [];
  for (const badge of doc.querySelectorAll("tr.finding .sev-error")) {
    const r = badge.getBoundingClientRect();
    const inView = (x, y) => { const at = doc.elementFromPoint(x, y); return at && badge.contains(at); };
    const [mx, my] = [r.left + r.width / 2, r.top + r.height / 2];
    // Wholly in the picture: not scrolled out of the table's view, nor under its sticky header.
    if (![[r.left + 3, my], [r.right - 3, my], [mx, r.top + 1], [mx, r.bottom - 1]].every(([x, y]) => inView(x, y))) continue;
    badges.push({row: badge.closest("tr.finding").dataset.name, text: badge.textContent.trim(),
                 color: getComputedStyle(badge).backgroundColor,
                 box: [r.left + inset[0], r.top + inset[1], r.width, r.height]});
  }
  return {badges, ratio: devicePixelRatio, rows: doc.querySelectorAll("tr.finding").length,
          text: doc.body.innerText.includes("Could not load")};
})()"""

BADGE_PIXELS = """(async (png, badges) => {
  const bytes = Uint8Array.from(atob(png), (c) => c.charCodeAt(0));
  const image = await createImageBitmap(new Blob([bytes], {type: "image/png"}));
  const canvas = new OffscreenCanvas(image.width, image.height);
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  return badges.map(({color, box: [x, y, w, h]}) => {
    const want = color.match(/\\d+/g).slice(0, 3).map(Number);
    // Inset past the rounded corners; the white text covers part of the rest.
    const left = Math.ceil(x + 4), top = Math.ceil(y + 1);
    const data = context.getImageData(left, top, Math.floor(x + w - 4) - left, Math.floor(y + h - 1) - top).data;
    let match = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (Math.abs(data[i] - want[0]) <= 8 && Math.abs(data[i + 1] - want[1]) <= 8 && Math.abs(data[i + 2] - want[2]) <= 8) match++;
    }
    return match / (data.length / 4);
  });
})"""


def visible_badges(row: str) -> str:
    """The script that waits for the tab's grid row ``row`` and lists the error badges in view."""
    return _VISIBLE_BADGES.replace("%(row)s", row)


def tab_screenshot(chromium: str, server: str, profile: Path, row: str) -> tuple[dict, bytes, list[float]]:
    """The Leafwatch tab of ``server`` at 1400x900, once its grid row ``row`` is drawn: the error
    badges in view (:func:`visible_badges`), the PNG, and the share of each badge's pixels in the
    error colour."""
    browser = DevTools(chromium, profile)
    try:
        browser.open(f"{server}/#leafwatch")
        browser.call("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        seen = browser.evaluate(visible_badges(row))
        png = browser.call("Page.captureScreenshot", {"format": "png"})["data"]
        shares = browser.evaluate(f"{BADGE_PIXELS}({json.dumps(png)}, {json.dumps(seen['badges'])})")
    finally:
        browser.close()
    return seen, base64.b64decode(png), shares
