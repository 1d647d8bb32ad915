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
import os
import ssl
import sys

from . import httpserve
from .admission import review
from .config import Config
from .httpserve import BodyError, JsonHandler

MAX_BODY = 8 * 1024 * 1024     # a Pod with many containers and env entries stays far below this


class _Handler(JsonHandler):
    name = "gpuproxy-webhook"
    max_body = MAX_BODY
    cfg: Config

    def do_POST(self):
        if self.path.split("?", 1)[0] != "/mutate":
            return self.send_body(404, b"not found")
        try:
            body = self.read_json()
        except BodyError:
            # an empty or oversized body is not a review at all; a body that
            # is not an object gets review()'s own refusal (allowed: false)
            if not 0 < int(self.headers.get("Content-Length") or 0) <= MAX_BODY:
                return self.send_body(400, b"an AdmissionReview body is required")
            body = {}
        self.send_body(200, review(body, self.cfg))


def make_handler(cfg: Config) -> type:
    return type("Handler", (_Handler,), {"cfg": cfg})


def make_server(cfg: Config, host: str, port: int, cert_dir: str | None):
    return httpserve.make_server(make_handler(cfg), host, port, cert_dir)


def start_in_thread(cfg: Config, host: str, port: int, cert_dir: str | None):
    return httpserve.start_in_thread(make_server(cfg, host, port, cert_dir), "gpuproxy-webhook")


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
