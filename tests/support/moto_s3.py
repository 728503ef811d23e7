"""moto's S3 server on 127.0.0.1 for the tests and benchmarks, run as its own
process: one of the S3 implementations Cairn is tested against (the other is
Ceph's radosgw, tests/support/radosgw.sh).

Usage:
  moto_s3.py [--port 0] [--bucket NAME ...] [--min-part-size BYTES]
             [--idle-timeout SECONDS] [--access-key KEY]

The first line on stdout is `port=<n>` (flushed) once the server accepts
connections and every --bucket exists; any other output (moto's own) goes
to stderr. It runs until its standard input reaches end of file, then exits
at once: start it with stdin connected to a pipe the test holds, so that it
stops when the test closes the pipe or dies for any reason (started with
stdin from /dev/null it exits immediately). SIGTERM stops it too.

What it adds to moto's own `moto_server`:
  - Requests are executed one at a time. moto checks a conditional write
    (If-Match, If-None-Match) and then stores the object in two steps, so
    two writers racing on one key under moto's threaded server could both
    win; S3 decides such a race atomically, and Cairn's lease protocol
    counts on that. Each request's body is read before it takes its turn,
    so a slow or killed client never holds the others up.
  - Multipart parts down to --min-part-size (default 256 KiB; S3's minimum
    is 5 MiB) are accepted, as radosgw.sh configures radosgw, so that the
    tests take the multipart path with small objects.
  - A connection idle for --idle-timeout seconds (default 5) is closed, as
    S3 and other servers close idle keep-alive connections, so that clients
    and the fault proxy meet a connection the server dropped.
  - A request signed with another access key than --access-key (default
    cairn-test) is refused with 403 InvalidAccessKeyId, as S3 refuses a key
    it does not know. moto checks no signatures, so any secret passes.
    Unsigned requests are accepted: each bucket's policy allows everyone
    everything, so that tests and benchmarks can look at the server with
    plain HTTP. Requests are path-style (http://127.0.0.1:PORT/BUCKET/KEY).
"""

import argparse
import http.client
import io
import json
import logging
import os
import re
import signal
import sys
import threading
import urllib.parse


def _parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--bucket", action="append", default=[], help="a bucket to create")
    ap.add_argument(
        "--min-part-size",
        type=int,
        default=256 * 1024,
        help="smallest multipart part accepted (bytes)",
    )
    ap.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="seconds after which an idle connection is closed",
    )
    ap.add_argument(
        "--access-key", default="cairn-test", help="the one access key signed requests may use"
    )
    return ap.parse_args(argv)


_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


class _OneAtATime:
    """WSGI middleware: refuses an unknown access key; reads the request
    body, then runs the request and produces its whole answer while holding
    one lock."""

    def __init__(self, app, access_key):
        self.app = app
        self.access_key = access_key
        self.lock = threading.Lock()

    def _access_key(self, environ):
        """The access key a request is signed with (header or presigned
        query), or None for an unsigned request."""
        m = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
        if m:
            return m.group(1)
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        credential = query.get("X-Amz-Credential", [""])[0]
        return credential.split("/", 1)[0] if credential else None

    def __call__(self, environ, start_response):
        key = self._access_key(environ)
        if key is not None and key != self.access_key:
            body = (
                (
                    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidAccessKeyId</Code>'
                    "<Message>The AWS Access Key Id you provided does not exist in our records."
                    "</Message><AWSAccessKeyId>{}</AWSAccessKeyId></Error>"
                )
                .format(key)
                .encode()
            )
            start_response(
                "403 Forbidden",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [b"" if environ["REQUEST_METHOD"] == "HEAD" else body]
        stream = environ["wsgi.input"]
        length = environ.get("CONTENT_LENGTH") or ""
        if length.isdigit():
            body = stream.read(int(length))
        elif environ.get("wsgi.input_terminated"):
            body = stream.read()
        else:
            body = b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        with self.lock:
            answer = self.app(environ, start_response)
            try:
                return [b"".join(answer)]
            finally:
                close = getattr(answer, "close", None)
                if close is not None:
                    close()


def _request(port, method, path, body, what):
    """One request to the server; exits with its answer if it fails."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
        if resp.status not in (200, 204):
            sys.exit("moto_s3: cannot {}: HTTP {} {}".format(what, resp.status, text))
    finally:
        conn.close()


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # moto reads its settings from the environment when first imported.
    os.environ["S3_UPLOAD_PART_MIN_SIZE"] = str(args.min_part_size)
    os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.server import MotoRequestHandler
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request

    class Handler(MotoRequestHandler):
        timeout = args.idle_timeout  # socket timeout: an idle connection is closed

    app = _OneAtATime(DomainDispatcherApplication(create_backend_app), args.access_key)
    server = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=Handler)
    port = server.server_port
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    for bucket in args.bucket:
        _request(port, "PUT", "/" + bucket, b"", "create bucket " + bucket)
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": ["arn:aws:s3:::" + bucket, "arn:aws:s3:::{}/*".format(bucket)],
                }
            ],
        }
        _request(
            port,
            "PUT",
            "/{}?policy".format(bucket),
            json.dumps(policy).encode(),
            "set the policy of bucket " + bucket,
        )
    sys.stdout.write("port={}\n".format(port))
    sys.stdout.flush()

    def stop(*_):
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while sys.stdin.buffer.read(4096):
        pass
    stop()


if __name__ == "__main__":
    main()
