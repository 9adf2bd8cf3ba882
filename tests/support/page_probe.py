#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Loads a page in headless Chromium and waits, without reloading it, until a JavaScript
condition holds on it; then prints one JSON line: whether it held, the page's text, the
console errors and uncaught exceptions seen, and the time waited. Optionally writes a
screenshot. Chromium is driven over its DevTools protocol on a pipe (--remote-debugging-pipe:
JSON messages ended by NUL on file descriptors 3 and 4), so nothing but the standard library
is needed.

  page_probe.py URL [--first 'JS expression'] --until 'JS expression' [--timeout-s 30]
                [--screenshot FILE]

With --first it waits for that condition first and prints {"first": true} (or false on
timeout, and stops) before waiting for --until, so that a caller can change what the page shows
once it is up and see the page follow without a reload.
"""
import argparse
import base64
import json
import os
import select
import subprocess
import sys
import time


class Browser:
    def __init__(self, chromium, width, height):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", "--window-size=%d,%d" % (width, height), "about:blank"],
            pass_fds=(3, 4, to_chrome_r, from_chrome_w), preexec_fn=fds,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        return self.next_id

    def receive(self, deadline):
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.from_chrome], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method, params=None, session=None, timeout=30):
        want = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(deadline)
            if message is None:
                raise RuntimeError(method + ": no answer within %d s" % timeout)
            if message.get("id") == want:
                if "error" in message:
                    raise RuntimeError(method + ": " + json.dumps(message["error"]))
                return message.get("result", {})
            self.events.append(message)

    def drain(self, seconds):
        deadline = time.monotonic() + seconds
        while True:
            message = self.receive(deadline)
            if message is None:
                return
            self.events.append(message)

    def close(self):
        try:
            self.send("Browser.close")
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()
            self.proc.wait()


def errors_of(events):
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                    for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append("log: " + entry.get("text", "") + " " + entry.get("url", ""))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--first", help="a JavaScript expression to wait for before --until")
    ap.add_argument("--until", required=True, help="a JavaScript expression to wait for")
    ap.add_argument("--timeout-s", type=float, default=30)
    ap.add_argument("--screenshot", help="a PNG of the page once the condition held (or not)")
    ap.add_argument("--chromium", default="chromium")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800)
    a = ap.parse_args()
    browser = Browser(a.chromium, a.width, a.height)
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            browser.call(domain, session=session)
        browser.call("Page.navigate", {"url": a.url}, session=session)

        def wait_for(expression):
            started = time.monotonic()
            while time.monotonic() - started < a.timeout_s:
                r = browser.call("Runtime.evaluate", {"expression": "Boolean(" + expression + ")",
                                                      "returnByValue": True}, session=session)
                if r.get("result", {}).get("value") is True:
                    return True, int((time.monotonic() - started) * 1000)
                browser.drain(0.2)
            return False, int((time.monotonic() - started) * 1000)

        if a.first:
            first, _ = wait_for(a.first)
            print(json.dumps({"first": first}), flush=True)
            if not first:
                return 1
        held, waited_ms = wait_for(a.until)
        browser.drain(0.3)  # errors the last render may have raised
        text = browser.call("Runtime.evaluate",
                            {"expression": "document.body ? document.body.innerText : ''",
                             "returnByValue": True}, session=session)
        if a.screenshot:
            shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=session)
            with open(a.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        print(json.dumps({"held": held, "waited_ms": waited_ms,
                          "text": text.get("result", {}).get("value", ""),
                          "errors": errors_of(browser.events)}))
        return 0
    except Exception as e:  # a failure to drive the browser: said, exit 2
        print(json.dumps({"held": False, "error": str(e), "errors": errors_of(browser.events)}))
        return 2
    finally:
        browser.close()


if __name__ == "__main__":
    sys.exit(main())
