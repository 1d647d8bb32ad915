"""The small HTTP(S) server that the webhook (webhook.py) and the node agent
(agent.py) share (stdlib only): one request handler base with a bounded body
reader, a JSON/text reply, GET /healthz and one stderr line per request, and
a threading server, wrapped in TLS when a certificate folder is given.

A service subclasses JsonHandler, sets `name` (its log prefix and Server
header) and `max_body`, and implements do_POST; GET answers /healthz only.

Locking: none of its own; ThreadingHTTPServer runs each request in its own
thread (daemon threads, so a stuck client never holds the process up at
exit), and the services lock what they share themselves.
"""
from __future__ import annotations

import errno
import json
import os
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BodyError(Exception):
    """A request body that is missing, too large or not a JSON object."""


class JsonHandler(BaseHTTPRequestHandler):
    name = "gpuproxy-http"
    max_body = 64 * 1024

    @property
    def server_version(self):           # the Server header
        return self.name

    def log_message(self, fmt, *args):
        sys.stderr.write(f"{self.name}: {self.address_string()} {fmt % args}\n")

    def send_body(self, code: int, body, ctype: str | None = None) -> None:
        """A dict is sent as JSON, a str or bytes as it is (text/plain unless
        ctype says otherwise)."""
        if isinstance(body, dict):
            data, ctype = json.dumps(body).encode(), ctype or "application/json"
        else:
            data = body if isinstance(body, bytes) else str(body).encode()
            ctype = ctype or "text/plain"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict:
        """The request's JSON object body; BodyError when there is none, it is
        larger than max_body, or it is not a JSON object."""
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if n <= 0 or n > self.max_body:
            raise BodyError(f"a JSON body of at most {self.max_body // 1024} KiB is required")
        try:
            body = json.loads(self.rfile.read(n))
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise BodyError("the body is not a JSON object")
        return body

    def do_GET(self):
        if self.path == "/healthz":
            return self.send_body(200, "ok")
        self.send_body(404, {"message": f"no {self.path}"})


def make_server(handler: type, host: str, port: int, cert_dir: str | None = None) -> ThreadingHTTPServer:
    """A threading server for handler on host:port; with cert_dir, HTTPS with
    its tls.crt and tls.key (a Kubernetes TLS Secret's keys), TLS 1.2 at
    least. A missing file raises FileNotFoundError naming it; an unusable
    certificate ssl.SSLError. The socket is closed on either."""
    srv = ThreadingHTTPServer((host, port), handler)
    srv.daemon_threads = True
    if cert_dir:
        try:
            for f in ("tls.crt", "tls.key"):
                if not os.path.isfile(os.path.join(cert_dir, f)):
                    raise FileNotFoundError(errno.ENOENT, "missing (the Secret of the server's certificate)",
                                            os.path.join(cert_dir, f))
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(os.path.join(cert_dir, "tls.crt"), os.path.join(cert_dir, "tls.key"))
            srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        except BaseException:
            srv.server_close()
            raise
    return srv


def start_in_thread(srv: ThreadingHTTPServer, name: str) -> ThreadingHTTPServer:
    threading.Thread(target=srv.serve_forever, name=name, daemon=True).start()
    return srv
