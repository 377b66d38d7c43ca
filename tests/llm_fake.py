"""A scripted OpenAI-compatible Chat Completions server, for tests (a model provider is outside the product).

Each request to ``POST /v1/chat/completions`` is recorded and answered by the current script: a JSON answer
(wrapped as the assistant message's content), an HTTP error status, or a delay past the caller's timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: ``answer`` as the content, or ``status`` as an error, after ``delay`` seconds."""

    answer: Any = None
    status: int = 200
    delay: float = 0.0
    raw_content: str | None = None  # sent verbatim as the message content (not JSON-encoded)


@dataclass
class FakeProvider:
    """The server's state: what it will answer and every request it got."""

    url: str = ""
    script: Callable[[dict[str, Any]], Reply] = field(default=lambda _req: Reply(answer={}))
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def answer(self, value: Any, **kw: Any) -> None:
        """Answer every request with ``value``."""
        self.script = lambda _req: Reply(answer=value, **kw)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def _completion(content: str, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@contextmanager
def fake_provider() -> Iterator[FakeProvider]:
    """Serve a FakeProvider on a free local port for the block."""
    state = FakeProvider()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/chat/completions":
                self.send_response(404)
                self.end_headers()
                return
            state.requests.append(body)
            state.headers.append({k.lower(): v for k, v in self.headers.items()})
            reply = state.script(body)
            if reply.delay:
                time.sleep(reply.delay)
            if reply.status != 200:
                out = json.dumps({"error": {"message": "scripted failure", "type": "server_error"}}).encode()
            else:
                content = reply.raw_content if reply.raw_content is not None else json.dumps(reply.answer)
                out = json.dumps(_completion(content, body.get("model", ""))).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


# A provider process of its own that dies of SIGSEGV the moment a chat call arrives, as a native model server
# with a bad build does: it prints its port, then serves until that first call.
_CRASHING = r"""
import os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        os.kill(os.getpid(), signal.SIGSEGV)

server = HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@dataclass
class CrashingProvider:
    """A provider process that dies of SIGSEGV mid-call; ``proc`` is the real OS process."""

    proc: subprocess.Popen[str]
    base_url: str


@contextmanager
def crashing_provider() -> Iterator[CrashingProvider]:
    """Run a provider process that segfaults on its first chat call, for the block."""
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield CrashingProvider(proc=proc, base_url=f"http://127.0.0.1:{port}/v1")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
