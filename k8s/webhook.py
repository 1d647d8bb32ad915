"""The HTTPS server of the mutating admission webhook (stdlib only).

POST /mutate with an AdmissionReview (admission.k8s.io/v1) answers the
review of admission.review; GET /healthz answers "ok". The API server
reaches it through the Service named in the MutatingWebhookConfiguration,
over TLS with the certificate of the Secret mounted at --cert-dir (tls.crt,
tls.key; the configuration's caBundle is that certificate's CA). The
controller runs it in a thread (controller.py); `python -m
gpuproxy.k8s.webhook` runs it alone.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .admission import review
from .config import Config

MAX_BODY = 8 * 1024 * 1024     # a Pod with many containers and env entries stays far below this


def make_handler(cfg: Config):
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuproxy-webhook"

        def log_message(self, fmt, *args):
            sys.stderr.write(f"gpuproxy-webhook: {self.address_string()} {fmt % args}\n")

        def _send(self, code: int, data: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/healthz":
                return self._send(200, b"ok", "text/plain")
            self._send(404, b"not found", "text/plain")

        def do_POST(self):
            if self.path.split("?", 1)[0] != "/mutate":
                return self._send(404, b"not found", "text/plain")
            n = int(self.headers.get("Content-Length") or 0)
            if n <= 0 or n > MAX_BODY:
                return self._send(400, b"an AdmissionReview body is required", "text/plain")
            try:
                body = json.loads(self.rfile.read(n))
            except ValueError:
                body = None
            out = review(body if isinstance(body, dict) else {}, cfg)
            self._send(200, json.dumps(out).encode(), "application/json")

    return Handler


def make_server(cfg: Config, host: str, port: int, cert_dir: str | None) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((host, port), make_handler(cfg))
    srv.daemon_threads = True
    if cert_dir:
        for f in ("tls.crt", "tls.key"):
            if not os.path.isfile(os.path.join(cert_dir, f)):
                srv.server_close()
                raise FileNotFoundError(errno.ENOENT, "missing (the Secret gpuproxy-webhook-tls)",
                                        os.path.join(cert_dir, f))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(os.path.join(cert_dir, "tls.crt"), os.path.join(cert_dir, "tls.key"))
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    return srv


def start_in_thread(cfg: Config, host: str, port: int, cert_dir: str | None) -> ThreadingHTTPServer:
    srv = make_server(cfg, host, port, cert_dir)
    threading.Thread(target=srv.serve_forever, name="gpuproxy-webhook", daemon=True).start()
    return srv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpuproxy-k8s-webhook", description="gpuproxy's mutating admission webhook")
    ap.add_argument("--listen", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8443)
    ap.add_argument("--cert-dir", default=os.environ.get("GPUPROXY_WEBHOOK_CERT_DIR", "/etc/gpuproxy/webhook-tls"))
    ap.add_argument("--insecure-http", action="store_true", help="plain HTTP (tests only; the API server needs TLS)")
    a = ap.parse_args(argv)
    try:
        cfg = Config.from_env()
        srv = make_server(cfg, a.listen, a.port, None if a.insecure_http else a.cert_dir)
    except ssl.SSLError as e:
        print(f"gpuproxy-k8s-webhook: the certificate in {a.cert_dir} is not usable: {e.reason or e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"gpuproxy-k8s-webhook: {e.filename or f'{a.listen}:{a.port}'}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"gpuproxy-k8s-webhook: {e}", file=sys.stderr)
        return 2
    print(f"gpuproxy-k8s-webhook: listening on {a.listen}:{a.port}", file=sys.stderr)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
