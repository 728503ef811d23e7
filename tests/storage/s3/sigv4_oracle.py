#!/usr/bin/env python3
"""Signs requests with botocore, an independent SigV4 implementation, so that
sigv4_test can compare Cairn's signatures with it byte for byte.

Usage: sigv4_oracle.py REQUESTS.json

REQUESTS.json is a list of objects:
  {"method", "url" (scheme://host + percent-encoded path), "query": [[name, value], ...]
   (raw), "headers": [[name, value], ...], "body_hex", "unsigned_payload" (bool),
   "service", "region", "access_key", "secret_key", "token", "timestamp" (YYYYMMDDTHHMMSSZ)}

Prints a JSON list, one object per request, with the headers botocore set:
  {"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}
(null where botocore set none).

Exit status 3 when botocore cannot be imported, so the caller can tell a missing
oracle from a failure.
"""

import datetime
import json
import sys
from unittest import mock

try:
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
except ImportError as e:
    print(f"cannot import botocore: {e}", file=sys.stderr)
    sys.exit(3)


class S3Config:
    def __init__(self, sign_payload):
        self.s3 = {"payload_signing_enabled": sign_payload}


def sign(spec):
    creds = botocore.credentials.Credentials(
        spec["access_key"], spec["secret_key"], spec["token"] or None
    )
    request = botocore.awsrequest.AWSRequest(
        method=spec["method"],
        url=spec["url"],
        data=bytes.fromhex(spec["body_hex"]),
        params=[tuple(p) for p in spec["query"]],
    )
    # HTTPHeaders appends on assignment, so repeated names stay repeated.
    for name, value in spec["headers"]:
        request.headers[name] = value
    if spec["service"] == "s3":
        signer = botocore.auth.S3SigV4Auth(creds, "s3", spec["region"])
        request.context["client_config"] = S3Config(not spec["unsigned_payload"])
    else:
        signer = botocore.auth.SigV4Auth(creds, spec["service"], spec["region"])
    when = datetime.datetime.strptime(spec["timestamp"], "%Y%m%dT%H%M%SZ")
    # add_auth() reads the clock itself; give it the request's time instead
    # (botocore 1.3x and later through get_current_datetime, older releases
    # through datetime.datetime.utcnow).
    if hasattr(botocore.auth, "get_current_datetime"):
        with mock.patch.object(botocore.auth, "get_current_datetime", return_value=when):
            signer.add_auth(request)
    else:
        with mock.patch.object(botocore.auth.datetime, "datetime") as fake:
            fake.utcnow.return_value = when
            fake.strptime = datetime.datetime.strptime
            signer.add_auth(request)
    return {
        name.lower(): request.headers.get(name)
        for name in (
            "Authorization",
            "X-Amz-Date",
            "X-Amz-Content-SHA256",
            "X-Amz-Security-Token",
        )
    }


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        specs = json.load(f)
    json.dump([sign(s) for s in specs], sys.stdout)


if __name__ == "__main__":
    main()
