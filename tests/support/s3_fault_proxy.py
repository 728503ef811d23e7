#!/usr/bin/env python3
"""A fault-injecting HTTP/1.1 proxy to put between an S3 client and an
S3-compatible test server (moto, radosgw), so tests can see how a client behaves
when requests fail, connections break or answers are slow or lost.

Usage:
  s3_fault_proxy.py --upstream http://127.0.0.1:PORT [--port 0]
      [--fault-rate 0.1] [--faults 500,503,slowdown,reset,reset-request,lost-reply,delay]
      [--delay-ms 200] [--seed N] [--methods PUT,POST] [--budget N]
      [--upstream-timeout 30] [--client-timeout 60] [--verbose]

The first line on stdout is `port=<n>` (flushed), the port it listens on at
127.0.0.1 (--port 0, the default, picks a free one).

Lifetime: the proxy runs until its standard input reaches end of file, then
exits at once (open connections are dropped). Start it with stdin connected
to a pipe the test holds: when the test closes the pipe, or dies for any
reason, the proxy exits too. (Started with stdin from /dev/null it exits
immediately.) Every upstream connection has a timeout (--upstream-timeout)
and every client connection an idle timeout (--client-timeout), so no
request can hang forever either.

Forwarding: every request (any method, headers, body) goes to the upstream
as it came, on an upstream keep-alive connection owned by the client's
connection; hop-by-hop headers (Connection, Keep-Alive, Transfer-Encoding,
Expect, ...) are dropped; Host is kept, so a signed request's signature still
covers what the server sees. Request bodies need a Content-Length: a chunked
request body is answered with S3's 411 MissingContentLength, as S3 does for
uploads without one.

Faults. Each proxied request draws from one random sequence (seeded by
--seed; the n-th request to arrive gets the n-th draw): with probability
`rate` it gets a fault, the kind chosen uniformly from `faults`:
  500            answer 500 InternalError (S3 XML body), not forwarded
  503            answer 503 ServiceUnavailable, not forwarded
  slowdown       answer 503 SlowDown, not forwarded
  lost-reply     forwarded and executed upstream, then the answer replaced
                 by 500 InternalError: a write that happened but whose answer
                 was lost (for idempotency tests)
  reset          forwarded; then the status line, headers and half of the
                 body are sent and the connection is reset (RST, SO_LINGER 0);
                 an answer without a body is reset before any byte of it
  reset-request  after reading half of the request body (none for requests
                 without a body), the connection is reset; not forwarded
  delay          sleep delay_ms, then forward normally
Error answers carry x-amz-request-id and x-amz-id-2 headers and an
<Error><Code/><Message/><Resource/><RequestId/></Error> body (no body for
HEAD, as S3 does). `methods` limits faults to those HTTP methods (empty: all);
`path_pattern` to requests whose path (the query left out, as sent: URL-encoded)
matches that regular expression anywhere (re.search; empty: all);
`budget` limits the number of faults injected from now on (null: no limit),
e.g. rate 1.0 and budget 2 fails exactly the next two requests.

A server without conditional writes: with `refuse_conditional_writes` true,
every PUT, POST or DELETE carrying If-Match or If-None-Match is answered
501 NotImplemented and not forwarded (GETs keep their conditions). Not a
fault: it draws nothing and is counted under "refused_conditional".

Control endpoint (answered by the proxy itself, never forwarded; no S3
bucket name can start with "__"):
  GET  /__fault__/config   the current configuration as JSON
  POST /__fault__/config   change it: a JSON object with any of
                           {"rate": 0.1, "faults": ["503", "reset"],
                            "delay_ms": 200, "seed": 7, "methods": ["PUT"],
                            "budget": 3 or null, "path_pattern": "lock$",
                            "refuse_conditional_writes": true}
                           (a new seed restarts the random sequence);
                           answers the new configuration, or 400 naming the
                           bad field
  GET  /__fault__/stats    {"requests": n, "forwarded": n, "passed": n,
                            "upstream_errors": n, "faults": {kind: n, ...}}
                           requests: proxied requests (control requests not
                           counted); forwarded: sent upstream (faults that
                           forward included); passed: answered without fault;
                           upstream_errors: answered 502 because the upstream
                           failed
  POST /__fault__/stats/reset   zero the counters

Python 3 standard library only.
"""

import argparse
import http.client
import http.server
import json
import os
import random
import re
import select
import socket
import struct
import sys
import threading
import time
import urllib.parse

KINDS = ("500", "503", "slowdown", "reset", "reset-request", "lost-reply", "delay")

# Faults answered by the proxy with an S3 error: (status, code, message).
ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "lost-reply": (500, "InternalError", "We encountered an internal error. Please try again."),
}

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
}

CONTROL_PREFIX = "/__fault__/"
CHUNK = 64 * 1024
# An upstream keep-alive connection idle longer than this is replaced rather
# than reused: Node's servers close idle connections after 5 s.
UPSTREAM_MAX_IDLE_S = 2.0


def parse_kinds(value):
    kinds = [k.strip() for k in value.split(",") if k.strip()] if isinstance(value, str) else value
    if not isinstance(kinds, list) or not kinds:
        raise ValueError("faults: a non-empty list of " + ", ".join(KINDS))
    for k in kinds:
        if k not in KINDS:
            raise ValueError("faults: unknown kind {!r} (known: {})".format(k, ", ".join(KINDS)))
    return kinds


class Faults:
    """The configuration, the seeded random sequence and the counters; shared
    by every connection's thread, guarded by one lock."""

    def __init__(self, rate, kinds, delay_ms, seed, methods, budget):
        self.lock = threading.Lock()
        self.rate = rate
        self.kinds = kinds
        self.delay_ms = delay_ms
        self.seed = seed
        self.methods = methods
        self.budget = budget
        self.refuse_conditional_writes = False
        self.path_pattern = ""
        self.rng = random.Random(seed)
        self.reset_stats()

    def reset_stats(self):
        self.stats = {
            "requests": 0,
            "forwarded": 0,
            "passed": 0,
            "upstream_errors": 0,
            "refused_conditional": 0,
            "faults": {k: 0 for k in KINDS},
        }

    def config(self):
        return {
            "rate": self.rate,
            "faults": list(self.kinds),
            "delay_ms": self.delay_ms,
            "seed": self.seed,
            "methods": list(self.methods),
            "budget": self.budget,
            "refuse_conditional_writes": self.refuse_conditional_writes,
            "path_pattern": self.path_pattern,
        }

    def update(self, changes):
        """Applies a JSON object of changes; raises ValueError naming the bad
        field and changes nothing in that case."""
        if not isinstance(changes, dict):
            raise ValueError("the body must be a JSON object")
        new = self.config()
        for key, value in changes.items():
            if key == "rate":
                if (
                    not isinstance(value, (int, float))
                    or isinstance(value, bool)
                    or not 0.0 <= value <= 1.0
                ):
                    raise ValueError("rate: a number from 0 to 1")
                new["rate"] = float(value)
            elif key == "faults":
                new["faults"] = parse_kinds(value)
            elif key == "delay_ms":
                if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                    raise ValueError("delay_ms: a number >= 0")
                new["delay_ms"] = value
            elif key == "seed":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError("seed: an integer")
                new["seed"] = value
            elif key == "methods":
                if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
                    raise ValueError("methods: a list of HTTP method names")
                new["methods"] = [m.upper() for m in value]
            elif key == "budget":
                if value is not None and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 0
                ):
                    raise ValueError("budget: an integer >= 0 or null")
                new["budget"] = value
            elif key == "refuse_conditional_writes":
                if not isinstance(value, bool):
                    raise ValueError("refuse_conditional_writes: true or false")
                new["refuse_conditional_writes"] = value
            elif key == "path_pattern":
                try:
                    re.compile(value)
                except (TypeError, re.error):
                    raise ValueError("path_pattern: a regular expression") from None
                new["path_pattern"] = value
            else:
                raise ValueError("unknown field {!r}".format(key))
        with self.lock:
            if "seed" in changes:
                self.rng = random.Random(new["seed"])
            self.rate, self.kinds, self.delay_ms = new["rate"], new["faults"], new["delay_ms"]
            self.seed, self.methods, self.budget = new["seed"], new["methods"], new["budget"]
            self.refuse_conditional_writes = new["refuse_conditional_writes"]
            self.path_pattern = new["path_pattern"]
            return self.config()

    def draw(self, method, path):
        """The fault for the next request (None: pass through), counted."""
        with self.lock:
            self.stats["requests"] += 1
            n = self.stats["requests"]
            # One draw per request whatever the configuration, so the n-th
            # request's fate depends only on the seed and n.
            roll, pick = self.rng.random(), self.rng.random()
            eligible = (not self.methods or method in self.methods) and (
                not self.path_pattern or re.search(self.path_pattern, path) is not None
            )
            if eligible and roll < self.rate and self.budget != 0:
                kind = self.kinds[int(pick * len(self.kinds))]
                if self.budget is not None:
                    self.budget -= 1
                self.stats["faults"][kind] += 1
            else:
                kind = None
                self.stats["passed"] += 1
            return kind, n, self.delay_ms

    def count(self, key):
        with self.lock:
            self.stats[key] += 1
            return self.stats[key]

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps(self.stats))


class BodyReader:
    """A file-like view of exactly `length` bytes of the client's request
    body, for streaming it upstream."""

    def __init__(self, rfile, length):
        self.rfile = rfile
        self.left = length

    def read(self, n=CHUNK):
        if self.left <= 0:
            return b""
        data = self.rfile.read(min(n if n and n > 0 else CHUNK, self.left, CHUNK))
        if not data:
            raise ConnectionError("client closed the connection in the request body")
        self.left -= len(data)
        return data


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "s3-fault-proxy"

    # Set on the class by main().
    faults = None
    upstream = None  # (host, port)
    upstream_timeout = 30.0
    verbose = False

    def setup(self):
        super().setup()
        self.up = None
        self.up_used = 0.0

    def finish(self):
        self.close_upstream()
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("s3_fault_proxy: " + (fmt % args) + "\n")

    # Every method goes through one handler.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.handle_any
        raise AttributeError(name)

    # --- upstream -----------------------------------------------------------

    def close_upstream(self):
        if self.up is not None:
            self.up.close()
            self.up = None

    def forward(self, body_length):
        """Sends the request upstream and returns the response (headers read,
        body not yet). A reused keep-alive connection that the upstream had
        already closed is retried once on a fresh one, but only when no byte
        of a request body had to be sent (the body is read from the client
        only once)."""
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP]
        if not any(k.lower() == "host" for k, _ in headers):
            headers.append(("Host", "{}:{}".format(*self.upstream)))
        for attempt in (0, 1):
            if self.up is not None and (
                time.monotonic() - self.up_used > UPSTREAM_MAX_IDLE_S or upstream_closed(self.up)
            ):
                self.close_upstream()
            reused = self.up is not None
            if self.up is None:
                self.up = http.client.HTTPConnection(*self.upstream, timeout=self.upstream_timeout)
            try:
                self.up.putrequest(
                    self.command, self.path, skip_host=True, skip_accept_encoding=True
                )
                for k, v in headers:
                    self.up.putheader(k, v)
                self.up.endheaders()
                if body_length:
                    body = BodyReader(self.rfile, body_length)
                    while True:
                        data = body.read()
                        if not data:
                            break
                        self.up.send(data)
                resp = self.up.getresponse()
                self.up_used = time.monotonic()
                return resp
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close_upstream()
                if attempt == 1 or not reused or body_length:
                    raise

    # --- answers ------------------------------------------------------------

    def error_reply(self, status, code, message, request_no):
        request_id = "FA{:014X}".format(request_no)
        resource = urllib.parse.urlsplit(self.path).path
        body = (
            (
                '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{}</Code>'
                "<Message>{}</Message><Resource>{}</Resource><RequestId>{}</RequestId>"
                "</Error>"
            )
            .format(code, message, xml_escape(resource), request_id)
            .encode()
        )
        if self.command == "HEAD":
            body = b""
        self.send_response_only(status)
        self.send_header("x-amz-request-id", request_id)
        self.send_header("x-amz-id-2", "fault-proxy/" + request_id)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Date", self.date_time_string())
        self.end_headers()
        if body:
            self.wfile.write(body)

    def json_reply(self, status, obj):
        body = (json.dumps(obj, indent=1) + "\n").encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def relay(self, resp, reset_midway=False):
        """Sends the upstream response to the client. With reset_midway, sends
        the status line, headers and half of the body, then resets."""
        no_body = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
        length = resp.getheader("Content-Length")
        if no_body:
            body_len = 0
        elif length is None or resp.chunked:
            # No length from the upstream: read it all (S3's bodies without a
            # length are small XML documents) and give the client one.
            data = resp.read()
            body_len = len(data)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(body_len)))
            resp = _Buffered(data, resp.status, resp.reason)
        else:
            body_len = int(length)
        if body_len == 0:
            # http.client reuses the upstream connection only once the answer
            # is read to its end, even an empty one.
            resp.read()
            if reset_midway:
                self.reset_connection()
                return
        self.send_response_only(resp.status, resp.reason)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if body_len == 0:
            return
        limit = body_len // 2 if reset_midway else body_len
        sent = 0
        while sent < limit:
            data = resp.read(min(CHUNK, limit - sent))
            if not data:
                raise ConnectionError("upstream closed the connection in the response body")
            self.wfile.write(data)
            sent += len(data)
        if reset_midway:
            # The upstream connection is left with an unread body: drop it.
            self.close_upstream()
            self.reset_connection()

    def reset_connection(self):
        """Aborts the client connection with a TCP RST (SO_LINGER 0)."""
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def drain(self, length):
        body = BodyReader(self.rfile, length)
        while body.read():
            pass

    # --- requests -----------------------------------------------------------

    def handle_any(self):
        try:
            self.handle_request()
        except (ConnectionError, socket.timeout, OSError) as e:
            self.log_message("connection ended: %s", e)
            self.close_connection = True

    def handle_request(self):
        if self.path.startswith(CONTROL_PREFIX):
            return self.control()
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # The body cannot be framed without a length: answer as S3 does
            # and close, since the unread body cannot be skipped.
            self.close_connection = True
            n = self.faults.count("requests")
            return self.error_reply(
                411, "MissingContentLength", "You must provide the Content-Length HTTP header.", n
            )
        try:
            body_length = int(self.headers.get("Content-Length", "0"))
            if body_length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self.send_error(400, "bad Content-Length")
            return

        if (
            self.faults.refuse_conditional_writes
            and self.command in ("PUT", "POST", "DELETE")
            and ("If-Match" in self.headers or "If-None-Match" in self.headers)
        ):
            self.drain(body_length)
            n = self.faults.count("refused_conditional")
            return self.error_reply(
                501,
                "NotImplemented",
                "A header you provided implies functionality that is not implemented",
                n,
            )
        kind, n, delay_ms = self.faults.draw(self.command, self.path.split("?", 1)[0])
        if kind in ("500", "503", "slowdown"):
            self.drain(body_length)
            status, code, message = ERRORS[kind]
            return self.error_reply(status, code, message, n)
        if kind == "reset-request":
            body = BodyReader(self.rfile, body_length // 2)
            while body.read():
                pass
            return self.reset_connection()
        if kind == "delay":
            time.sleep(delay_ms / 1000.0)

        try:
            resp = self.forward(body_length)
        except (OSError, ValueError, http.client.HTTPException) as e:
            # ValueError: http.client refused a header of the request.
            self.faults.count("upstream_errors")
            self.close_upstream()
            # The request body may be partly unread: this connection is done.
            self.close_connection = True
            return self.error_reply(502, "BadGateway", "upstream: {}".format(e), n)
        self.faults.count("forwarded")
        if kind == "lost-reply":
            resp.read()
            status, code, message = ERRORS[kind]
            return self.error_reply(status, code, message, n)
        self.relay(resp, reset_midway=(kind == "reset"))

    def control(self):
        length = int(self.headers.get("Content-Length", "0") or 0)
        body = self.rfile.read(length) if length else b""
        what = urllib.parse.urlsplit(self.path).path[len(CONTROL_PREFIX) :]
        if what == "config" and self.command == "GET":
            with self.faults.lock:
                return self.json_reply(200, self.faults.config())
        if what == "config" and self.command == "POST":
            try:
                changes = json.loads(body.decode() or "{}")
                return self.json_reply(200, self.faults.update(changes))
            except (ValueError, UnicodeDecodeError) as e:
                return self.json_reply(400, {"error": str(e)})
        if what == "stats" and self.command == "GET":
            return self.json_reply(200, self.faults.snapshot())
        if what == "stats/reset" and self.command == "POST":
            with self.faults.lock:
                self.faults.reset_stats()
            return self.json_reply(200, self.faults.snapshot())
        return self.json_reply(
            404, {"error": "unknown control request {} {}".format(self.command, self.path)}
        )


class _Buffered:
    """An already read upstream body, with the attributes relay() uses."""

    def __init__(self, data, status, reason):
        self.data = data
        self.pos = 0
        self.status = status
        self.reason = reason

    def read(self, n=-1):
        end = len(self.data) if n is None or n < 0 else self.pos + n
        out = self.data[self.pos : end]
        self.pos += len(out)
        return out


def upstream_closed(conn):
    """Whether an idle keep-alive connection was closed by the upstream (it
    is readable: EOF, since no answer is pending)."""
    if conn.sock is None:
        return True
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT of the S3 server")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one)")
    ap.add_argument("--fault-rate", type=float, default=0.0, help="fraction of requests faulted")
    ap.add_argument(
        "--faults", default="500,503,slowdown", help="comma-separated kinds: " + ",".join(KINDS)
    )
    ap.add_argument("--delay-ms", type=float, default=200.0, help="the delay fault's sleep")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault sequence")
    ap.add_argument("--methods", default="", help="comma-separated methods faults may hit")
    ap.add_argument("--budget", type=int, default=None, help="at most this many faults")
    ap.add_argument("--upstream-timeout", type=float, default=30.0, help="seconds")
    ap.add_argument(
        "--client-timeout",
        type=float,
        default=60.0,
        help="seconds a client connection may stay idle or stall",
    )
    ap.add_argument("--verbose", action="store_true", help="log requests to stderr")
    args = ap.parse_args()

    up = urllib.parse.urlsplit(args.upstream)
    if up.scheme != "http" or not up.hostname or not up.port:
        ap.error("--upstream must be http://HOST:PORT")
    try:
        kinds = parse_kinds(args.faults)
    except ValueError as e:
        ap.error(str(e))
    faults = Faults(
        0.0,
        kinds,
        args.delay_ms,
        args.seed,
        [m.strip().upper() for m in args.methods.split(",") if m.strip()],
        None,
    )
    try:
        faults.update({"rate": args.fault_rate, "budget": args.budget})
    except ValueError as e:
        ap.error(str(e))

    Handler.faults = faults
    Handler.upstream = (up.hostname, up.port)
    Handler.upstream_timeout = args.upstream_timeout
    Handler.timeout = args.client_timeout
    Handler.verbose = args.verbose

    server = Server(("127.0.0.1", args.port), Handler)
    print("port={}".format(server.server_address[1]), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    # Lifetime: until stdin closes (see the top of this file).
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, KeyboardInterrupt):
        pass
    # Daemon threads end with the process; open connections are dropped.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
