#!/usr/bin/env python3
"""Tests of the fault proxy (s3_fault_proxy.py) against moto's S3 server on
127.0.0.1: at rate 0 it is transparent; at rate 1 each fault kind reaches the
client as documented; the counters, the control endpoint, the seed and the
stdin lifetime rule work. Run by CTest as s3_fault_proxy_test; on its own:

  .venv/bin/python tests/support/s3_fault_proxy_test.py -v
"""

import hashlib
import http.client
import os
import random
import socket
import sys
import time
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3_servers import ACCESS_KEY, SECRET_KEY, FaultProxy, MotoS3

try:
    import botocore.session
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError:  # botocore (requirements.txt, scripts/install-deps.sh)
    botocore = None

BUCKET = "proxytest"
MiB = 1 << 20


def error_code(body):
    return ET.fromstring(body).findtext("Code")


class ProxyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s3 = MotoS3(bucket=BUCKET).__enter__()
        try:
            cls.proxy = FaultProxy(cls.s3.endpoint, ["--seed", "1"]).__enter__()
        except BaseException:
            cls.s3.__exit__(None, None, None)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        cls.s3.__exit__(None, None, None)

    def setUp(self):
        self.proxy.configure(
            rate=0.0, faults=["500"], delay_ms=200, methods=[], budget=None, path_pattern=""
        )
        self.proxy.reset_stats()
        self.conns = []

    def tearDown(self):
        for c in self.conns:
            c.close()

    # --- requests -----------------------------------------------------------

    def conn(self, port=None):
        c = http.client.HTTPConnection("127.0.0.1", port or self.proxy.port, timeout=10)
        self.conns.append(c)
        return c

    def request(self, method, key, body=None, headers=None, conn=None, port=None):
        c = conn or self.conn(port)
        c.request(method, "/{}/{}".format(BUCKET, key), body=body, headers=headers or {})
        resp = c.getresponse()
        return resp, resp.read()

    def direct(self, method, key, body=None):
        """The same request straight to the server, bypassing the proxy."""
        return self.request(method, key, body, port=self.s3.port)

    def client(self):
        session = botocore.session.get_session()
        client = session.create_client(
            "s3",
            region_name="us-east-1",
            endpoint_url=self.proxy.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=5,
                read_timeout=10,
            ),
        )
        self.addCleanup(client.close)
        return client

    # --- rate 0: a transparent proxy ----------------------------------------

    def test_passthrough_put_get_head_range_delete_on_one_connection(self):
        data = random.Random(5).randbytes(3 * MiB + 17)
        c = self.conn()
        resp, _ = self.request(
            "PUT", "pass/a", body=data, conn=c, headers={"Content-Type": "application/octet-stream"}
        )
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.getheader("ETag"), '"{}"'.format(hashlib.md5(data).hexdigest()))
        sock = c.sock
        resp, body = self.request("GET", "pass/a", conn=c)
        self.assertEqual((resp.status, body), (200, data))
        resp, body = self.request("GET", "pass/a", conn=c, headers={"Range": "bytes=100-1099"})
        self.assertEqual(resp.status, 206)
        self.assertEqual(body, data[100:1100])
        self.assertEqual(resp.getheader("Content-Range"), "bytes 100-1099/{}".format(len(data)))
        resp, body = self.request("HEAD", "pass/a", conn=c)
        self.assertEqual((resp.status, body), (200, b""))
        self.assertEqual(int(resp.getheader("Content-Length")), len(data))
        resp, body = self.request("GET", "pass/missing", conn=c)
        self.assertEqual(resp.status, 404)
        self.assertEqual(error_code(body), "NoSuchKey")
        resp, _ = self.request("DELETE", "pass/a", conn=c)
        self.assertEqual(resp.status, 204)
        resp, _ = self.direct("HEAD", "pass/a")
        self.assertEqual(resp.status, 404)
        self.assertIs(c.sock, sock, "the client's keep-alive connection was not kept")
        stats = self.proxy.stats()
        self.assertEqual((stats["requests"], stats["forwarded"], stats["passed"]), (6, 6, 6))
        self.assertEqual(sum(stats["faults"].values()), 0)

    def test_upstream_connection_survives_the_servers_idle_close(self):
        # The server closes idle keep-alive connections after 5 s; the
        # proxy must not answer the next request with an error.
        c = self.conn()
        self.assertEqual(self.request("PUT", "idle/a", body=b"x", conn=c)[0].status, 200)
        time.sleep(5.5)
        self.assertEqual(self.request("GET", "idle/a", conn=c)[0].status, 200)
        self.assertEqual(self.proxy.stats()["upstream_errors"], 0)

    @unittest.skipIf(botocore is None, "python3-botocore is not installed")
    def test_passthrough_multipart_and_listing_with_botocore(self):
        s3 = self.client()
        rng = random.Random(9)
        parts = [rng.randbytes(5 * MiB), rng.randbytes(MiB + 3)]
        up = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/obj")
        etags = [
            s3.upload_part(
                Bucket=BUCKET, Key="mp/obj", UploadId=up["UploadId"], PartNumber=i + 1, Body=p
            )["ETag"]
            for i, p in enumerate(parts)
        ]
        s3.complete_multipart_upload(
            Bucket=BUCKET,
            Key="mp/obj",
            UploadId=up["UploadId"],
            MultipartUpload={
                "Parts": [{"ETag": e, "PartNumber": i + 1} for i, e in enumerate(etags)]
            },
        )
        got = s3.get_object(Bucket=BUCKET, Key="mp/obj")["Body"].read()
        self.assertEqual(got, b"".join(parts))
        listing = s3.list_objects_v2(Bucket=BUCKET, Prefix="mp/")
        self.assertEqual([o["Key"] for o in listing["Contents"]], ["mp/obj"])
        s3.delete_object(Bucket=BUCKET, Key="mp/obj")
        stats = self.proxy.stats()
        self.assertEqual(stats["requests"], 7)
        self.assertEqual(stats["passed"], 7)

    # --- rate 1: each fault kind --------------------------------------------

    def check_error_fault(self, kind, status, code):
        self.proxy.configure(rate=1.0, faults=[kind])
        resp, body = self.request("PUT", "err/" + kind, body=b"never stored")
        self.assertEqual(resp.status, status)
        self.assertEqual(error_code(body), code)
        root = ET.fromstring(body)
        self.assertTrue(root.findtext("Message"))
        self.assertEqual(root.findtext("RequestId"), resp.getheader("x-amz-request-id"))
        self.assertEqual(root.findtext("Resource"), "/{}/err/{}".format(BUCKET, kind))
        self.assertEqual(resp.getheader("Content-Type"), "application/xml")
        # HEAD gets the status without a body, as from S3.
        resp, body = self.request("HEAD", "err/" + kind)
        self.assertEqual((resp.status, body), (status, b""))
        # Not forwarded: the object was never written.
        self.assertEqual(self.direct("HEAD", "err/" + kind)[0].status, 404)
        stats = self.proxy.stats()
        self.assertEqual(stats["faults"][kind], 2)
        self.assertEqual(stats["forwarded"], 0)
        self.assertEqual(stats["requests"], 2)

    def test_fault_500(self):
        self.check_error_fault("500", 500, "InternalError")

    def test_fault_503(self):
        self.check_error_fault("503", 503, "ServiceUnavailable")

    def test_fault_slowdown(self):
        self.check_error_fault("slowdown", 503, "SlowDown")

    @unittest.skipIf(botocore is None, "python3-botocore is not installed")
    def test_botocore_sees_slowdown_and_the_connection_stays_usable(self):
        s3 = self.client()
        self.proxy.configure(rate=1.0, faults=["slowdown"], budget=1)
        with self.assertRaises(ClientError) as ctx:
            s3.put_object(Bucket=BUCKET, Key="boto/slow", Body=b"x" * 1000)
        err = ctx.exception.response
        self.assertEqual(err["Error"]["Code"], "SlowDown")
        self.assertEqual(err["ResponseMetadata"]["HTTPStatusCode"], 503)
        self.assertTrue(err["ResponseMetadata"]["RequestId"])
        # The budget is spent: the next request passes.
        s3.put_object(Bucket=BUCKET, Key="boto/slow", Body=b"y" * 1000)
        self.assertEqual(s3.get_object(Bucket=BUCKET, Key="boto/slow")["Body"].read(), b"y" * 1000)

    def test_fault_lost_reply_executes_the_write(self):
        self.direct("PUT", "lost/a", body=b"old")
        self.proxy.configure(rate=1.0, faults=["lost-reply"])
        resp, body = self.request("PUT", "lost/a", body=b"new contents")
        self.assertEqual(resp.status, 500)
        self.assertEqual(error_code(body), "InternalError")
        self.assertTrue(resp.getheader("x-amz-request-id"))
        # The client saw a failure, yet the write happened.
        resp, body = self.direct("GET", "lost/a")
        self.assertEqual(body, b"new contents")
        resp, body = self.request("DELETE", "lost/a")
        self.assertEqual(resp.status, 500)
        self.assertEqual(self.direct("HEAD", "lost/a")[0].status, 404)
        stats = self.proxy.stats()
        self.assertEqual(stats["faults"]["lost-reply"], 2)
        self.assertEqual(stats["forwarded"], 2)

    def test_fault_reset_in_the_response_body(self):
        data = random.Random(3).randbytes(2 * MiB)
        self.direct("PUT", "reset/a", body=data)
        self.proxy.configure(rate=1.0, faults=["reset"])
        c = self.conn()
        c.request("GET", "/{}/reset/a".format(BUCKET))
        resp = c.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertEqual(int(resp.getheader("Content-Length")), len(data))
        got = bytearray()
        with self.assertRaises((http.client.IncompleteRead, ConnectionResetError)):
            while True:
                chunk = resp.read(65536)
                if not chunk:
                    # EOF before Content-Length: http.client raises
                    # IncompleteRead on the read after a short one.
                    raise http.client.IncompleteRead(bytes(got), len(data) - len(got))
                got += chunk
        self.assertLess(len(got), len(data))
        self.assertEqual(bytes(got), data[: len(got)])

    def test_fault_reset_of_an_answer_without_body_after_the_write(self):
        self.proxy.configure(rate=1.0, faults=["reset"])
        with self.assertRaises((ConnectionResetError, http.client.RemoteDisconnected)):
            self.request("PUT", "reset/b", body=b"written")
        # Forwarded: the write happened though the client saw only a reset.
        self.assertEqual(self.direct("GET", "reset/b")[1], b"written")

    def test_fault_reset_request_mid_body(self):
        self.proxy.configure(rate=1.0, faults=["reset-request"])
        data = b"z" * (4 * MiB)
        with self.assertRaises(
            (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)
        ):
            self.request("PUT", "resetreq/a", body=data)
        self.assertEqual(self.direct("HEAD", "resetreq/a")[0].status, 404)
        with self.assertRaises((ConnectionResetError, http.client.RemoteDisconnected)):
            self.request("GET", "resetreq/a")
        stats = self.proxy.stats()
        self.assertEqual(stats["faults"]["reset-request"], 2)
        self.assertEqual(stats["forwarded"], 0)

    def test_fault_delay(self):
        self.direct("PUT", "delay/a", body=b"slow")
        self.proxy.configure(rate=1.0, faults=["delay"], delay_ms=400)
        start = time.monotonic()
        resp, body = self.request("GET", "delay/a")
        elapsed = time.monotonic() - start
        self.assertEqual((resp.status, body), (200, b"slow"))
        self.assertGreaterEqual(elapsed, 0.4)
        self.assertLess(elapsed, 5.0)
        self.assertEqual(self.proxy.stats()["faults"]["delay"], 1)

    def test_client_keeps_its_connection_after_error_faults(self):
        c = self.conn()
        self.proxy.configure(rate=1.0, faults=["500", "503", "slowdown", "lost-reply"])
        for i in range(8):
            resp, _ = self.request("PUT", "keep/" + str(i), body=b"b" * 1000, conn=c)
            self.assertIn(resp.status, (500, 503))
        sock = c.sock
        self.proxy.configure(rate=0.0)
        self.assertEqual(self.request("PUT", "keep/ok", body=b"ok", conn=c)[0].status, 200)
        self.assertIs(c.sock, sock)

    # --- selection, counters, control ---------------------------------------

    def pattern(self, n):
        out = []
        c = self.conn()
        for _ in range(n):
            resp, _ = self.request("GET", "seq/a", conn=c)
            out.append(resp.status)
        return out

    def test_seed_makes_the_fault_sequence_repeatable_and_stats_count_it(self):
        self.direct("PUT", "seq/a", body=b"s")
        self.proxy.configure(rate=0.3, faults=["503", "slowdown"], seed=42)
        first = self.pattern(60)
        stats = self.proxy.stats()
        faulted = sum(1 for s in first if s == 503)
        self.assertTrue(5 <= faulted <= 35, first)
        self.assertEqual(stats["requests"], 60)
        self.assertEqual(stats["faults"]["503"] + stats["faults"]["slowdown"], faulted)
        self.assertGreater(stats["faults"]["503"], 0)
        self.assertGreater(stats["faults"]["slowdown"], 0)
        self.assertEqual(stats["passed"], 60 - faulted)
        self.assertEqual(stats["forwarded"], 60 - faulted)
        self.proxy.configure(seed=42)
        self.assertEqual(self.pattern(60), first)
        self.proxy.configure(seed=43)
        self.assertNotEqual(self.pattern(60), first)

    def test_budget_and_methods(self):
        self.proxy.configure(rate=1.0, faults=["500"], budget=2)
        self.assertEqual(
            [self.request("GET", "b/x")[0].status for _ in range(4)], [500, 500, 404, 404]
        )
        self.assertEqual(self.proxy.config()["budget"], 0)
        self.proxy.configure(budget=None, methods=["put"])
        self.assertEqual(self.request("GET", "b/x")[0].status, 404)
        self.assertEqual(self.request("PUT", "b/x", body=b"1")[0].status, 500)
        self.proxy.configure(methods=[], path_pattern=r"/b/y$")
        self.assertEqual(self.request("GET", "b/x")[0].status, 404)
        self.assertEqual(self.request("GET", "b/y?versionId=1")[0].status, 500)
        self.assertEqual(self.request("GET", "b/yz")[0].status, 404)
        with self.assertRaisesRegex(ValueError, "path_pattern"):
            self.proxy.configure(path_pattern="(")

    def test_refused_conditional_writes_are_501_and_not_forwarded(self):
        self.proxy.configure(refuse_conditional_writes=True)
        for header in ("If-Match", "If-None-Match"):
            resp, body = self.request("PUT", "c/x", body=b"1", headers={header: "*"})
            self.assertEqual((resp.status, error_code(body)), (501, "NotImplemented"))
        self.assertEqual(self.direct("GET", "c/x")[0].status, 404)
        # Plain writes and conditional reads pass.
        self.assertEqual(self.request("PUT", "c/x", body=b"1")[0].status, 200)
        etag = self.request("HEAD", "c/x")[0].getheader("ETag")
        self.assertEqual(self.request("GET", "c/x", headers={"If-Match": etag})[0].status, 200)
        self.assertEqual(self.proxy.stats()["refused_conditional"], 2)
        self.proxy.configure(refuse_conditional_writes=False)
        resp, _ = self.request("PUT", "c/y", body=b"1", headers={"If-None-Match": "*"})
        self.assertNotEqual(resp.status, 501)

    def test_control_endpoint(self):
        cfg = self.proxy.configure(rate=0.25, faults=["reset", "delay"], delay_ms=10)
        self.assertEqual(cfg, self.proxy.config())
        self.assertEqual(
            (cfg["rate"], cfg["faults"], cfg["delay_ms"]), (0.25, ["reset", "delay"], 10)
        )
        for bad in (
            {"rate": 2},
            {"faults": ["nope"]},
            {"faults": []},
            {"delay_ms": -1},
            {"budget": "x"},
            {"colour": 1},
        ):
            with self.assertRaises(ValueError, msg=bad):
                self.proxy.configure(**bad)
        self.assertEqual(self.proxy.config(), cfg)  # a bad request changes nothing
        c = self.conn()
        c.request("POST", "/__fault__/config", body=b"not json")
        resp = c.getresponse()
        self.assertEqual(resp.status, 400)
        resp.read()
        c.request("GET", "/__fault__/nothing")
        resp = c.getresponse()
        self.assertEqual(resp.status, 404)
        resp.read()
        # Control requests are not counted and never faulted.
        stats = self.proxy.stats()
        self.assertEqual(stats["requests"], 0)
        self.proxy.configure(rate=0.0)
        self.request("GET", "ctl/none")
        self.assertEqual(self.proxy.stats()["requests"], 1)
        self.assertEqual(self.proxy.reset_stats()["requests"], 0)

    def test_flags_configure_at_start_and_stdin_eof_ends_the_proxy(self):
        with FaultProxy(
            self.s3.endpoint,
            [
                "--fault-rate",
                "1",
                "--faults",
                "slowdown,503",
                "--delay-ms",
                "5",
                "--seed",
                "7",
                "--methods",
                "GET",
                "--budget",
                "3",
            ],
        ) as p:
            cfg = p.config()
            self.assertEqual(
                cfg,
                {
                    "rate": 1.0,
                    "faults": ["slowdown", "503"],
                    "delay_ms": 5.0,
                    "seed": 7,
                    "methods": ["GET"],
                    "budget": 3,
                    "refuse_conditional_writes": False,
                    "path_pattern": "",
                },
            )
            resp, _ = self.request("GET", "flags/a", port=p.port)
            self.assertEqual(resp.status, 503)
            # An idle client connection must not keep it alive.
            idle = socket.create_connection(("127.0.0.1", p.port))
            try:
                self.assertEqual(p.close_stdin_and_wait(timeout=5), 0)
            finally:
                idle.close()
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", p.port), timeout=2).close()


if __name__ == "__main__":
    unittest.main()
