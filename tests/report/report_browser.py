"""Headless Debian chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL on fds 3/4), with the standard library only; and a small PNG
decoder for checking screenshots."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib

import numpy as np

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio"]


def chromium_path() -> str | None:
    p = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    return p if p and os.access(p, os.X_OK) else None


class Browser:
    """One headless chromium with a fresh profile; ``load(url)`` returns the events seen."""

    def __init__(self, path: str | None = None, *, width: int = 1400, height: int = 1000):
        self.path = path or chromium_path()
        if self.path is None:
            raise FileNotFoundError("chromium not found")
        self.profile = tempfile.mkdtemp(prefix="dccl-chromium-")
        r_in, w_in = os.pipe()    # we write → chromium reads fd 3
        r_out, w_out = os.pipe()  # chromium writes fd 4 → we read

        def child():
            os.dup2(r_in, 3)
            os.dup2(w_out, 4)

        self.proc = subprocess.Popen([self.path, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={width},{height}", "--remote-debugging-pipe", "about:blank"],
                                     pass_fds=(3, 4), preexec_fn=child, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(r_in)
        os.close(w_out)
        self._w = w_in
        self._r = r_out
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session = None

    # -- protocol --------------------------------------------------------------------------
    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _recv(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, *, session: str | None = "page",
             timeout: float = 60.0) -> dict:
        sid = self.session if session == "page" else session
        i = self._send(method, params, sid)
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(max(0.0, deadline - time.monotonic()))
            if m is None:
                raise TimeoutError(f"no reply to {method} within {timeout} s")
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict | None:
        for m in self.events:
            if m.get("method") == method:
                return m
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self._recv(deadline - time.monotonic())
            if m is None:
                break
            self.events.append(m)
            if m.get("method") == method:
                return m
        return None

    # -- high level ------------------------------------------------------------------------
    def open(self) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=None)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable", "Network.enable"):
            self.call(domain)

    def load(self, url: str, timeout: float = 90.0) -> None:
        if self.session is None:
            self.open()
        self.call("Page.navigate", {"url": url})
        if self.wait_event("Page.loadEventFired", timeout) is None:
            raise TimeoutError(f"{url} did not finish loading within {timeout} s")

    def evaluate(self, expression: str, timeout: float = 60.0):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluate failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, *, full_page: bool = True) -> bytes:
        params: dict = {"format": "png", "optimizeForSpeed": True}
        if full_page:
            m = self.call("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m["contentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000), "scale": 1})
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions, failed loads and log entries of level error."""
        out = []
        for m in self.events:
            meth, p = m.get("method"), m.get("params", {})
            if meth == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif meth == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif meth == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif meth == "Network.loadingFailed":
                out.append(f"load failed: {p.get('errorText')}")
        return out

    def requests(self) -> list[str]:
        return [m["params"]["request"]["url"] for m in self.events if m.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self._send("Browser.close")
            self.proc.wait(10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait(10)
        finally:
            for fd in (self._w, self._r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def decode_png(data: bytes) -> np.ndarray:
    """RGB(A) 8-bit non-interlaced PNG → uint8 array (h, w, channels)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG (depth {depth}, colour type {ctype}, interlace {interlace})")
    ch = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * ch)
    filters = raw[:, 0]
    if np.any(filters > 2):
        raise ValueError("PNG uses Average/Paeth filters; capture with optimizeForSpeed (filters None/Sub/Up)")
    if np.all(filters[1:] == 2) and filters[0] in (0, 2):  # "Up" everywhere: a running sum down columns
        out = np.cumsum(raw[:, 1:].astype(np.int64), axis=0) & 255
        return out.reshape(h, w, ch).astype(np.uint8)
    out = np.zeros((h, w * ch), np.int64)
    prev = np.zeros(w * ch, np.int64)
    for y in range(h):
        line = raw[y, 1:].astype(np.int64)
        if filters[y] == 1:
            line = np.cumsum(line.reshape(w, ch), axis=0).reshape(-1)
        elif filters[y] == 2:
            line = line + prev
        prev = line & 255
        out[y] = prev
    return out.reshape(h, w, ch).astype(np.uint8)
