#!/usr/bin/env python3
"""A local stand-in for the EC2 instance metadata service (IMDSv2) and a
container credentials endpoint, for the credentials end-to-end test.

Usage: imds_server.py --expiration 2026-11-23T12:00:00Z [--role NAME]
                      [--container-path /v2/credentials/x --container-token TOKEN]

Listens on 127.0.0.1, on a port the system picks, and prints that port on
its own line on standard output. Serves until killed or until standard input
closes.

IMDSv2 as EC2 speaks it:
  PUT /latest/api/token needs X-aws-ec2-metadata-token-ttl-seconds (1..21600)
      and answers a session token; without the header, 400.
  GET /latest/meta-data/... needs X-aws-ec2-metadata-token set to a token it
      issued; otherwise 401.
  GET /latest/meta-data/iam/security-credentials/        -> the role name
  GET /latest/meta-data/iam/security-credentials/<role>  -> the credentials
The container path answers the credentials only when the Authorization
header equals --container-token; otherwise 401.
"""

import argparse
import http.server
import json
import secrets
import sys
import threading


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--expiration", required=True)
    parser.add_argument("--role", default="cairn-test-role")
    parser.add_argument("--container-path", default="/v2/credentials/cairn")
    parser.add_argument("--container-token", default="")
    args = parser.parse_args()

    tokens = set()
    lock = threading.Lock()
    creds_path = "/latest/meta-data/iam/security-credentials/"

    def credentials(prefix):
        return {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": prefix + "AKID",
            "SecretAccessKey": prefix + "SECRET",
            "Token": prefix + "TOKEN",
            "Expiration": args.expiration,
        }

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # keep the test output quiet
            pass

        def reply(self, status, body="", content_type="text/plain"):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if self.path != "/latest/api/token":
                return self.reply(404)
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self.reply(400)
            token = secrets.token_urlsafe(24)
            with lock:
                tokens.add(token)
            self.reply(200, token)

        def do_GET(self):
            if self.path == args.container_path:
                if (
                    not args.container_token
                    or self.headers.get("Authorization") != args.container_token
                ):
                    return self.reply(401)
                return self.reply(200, json.dumps(credentials("CONTAINER")), "application/json")
            with lock:
                ok = self.headers.get("X-aws-ec2-metadata-token") in tokens
            if not ok:
                return self.reply(401)
            if self.path == creds_path:
                return self.reply(200, args.role)
            if self.path == creds_path + args.role:
                return self.reply(200, json.dumps(credentials("IMDS")), "application/json")
            self.reply(404)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # until the test closes our standard input, or kills us
    server.shutdown()


if __name__ == "__main__":
    main()
