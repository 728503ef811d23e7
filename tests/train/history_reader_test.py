#!/usr/bin/env python3
"""Reads a Trainer run's result files back with only the standard library.

history_tool runs a small Trainer; this test then checks, independently of
Cairn's code:
  - result.json: one JSON object a line, training_iteration 1..N;
  - progress.csv: parsed by the csv module, one row per line of result.json
    with its values flattened ("eval/acc"), strings with commas, quotes and
    newlines intact, and a column that appeared later present in every row;
  - the TensorBoard event file: TFRecord framing with both masked CRC32C
    checked byte for byte, a first Event with file_version "brain.Event:2",
    then per round an Event whose step is training_iteration and whose
    summary holds every numeric key of the row but the axes (as Ray's
    TensorBoard logger: iterations_since_restore and time_this_iter_s too;
    tags, simple_value floats), the protobuf wire format decoded by hand.
Usage: history_reader_test.py PATH_TO_HISTORY_TOOL [--tune]
(with --tune the tool runs the same loop as a Tuner's one trial and the
trial's folder is read)
"""

import csv
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
    pos = 0
    while pos < len(blob):
        header = blob[pos : pos + 12]
        assert len(header) == 12, "truncated record header at %d" % pos
        (length,) = struct.unpack("<Q", header[:8])
        (len_crc,) = struct.unpack("<I", header[8:12])
        assert len_crc == masked(header[:8]), "length CRC at %d" % pos
        data = blob[pos + 12 : pos + 12 + length]
        (data_crc,) = struct.unpack("<I", blob[pos + 12 + length : pos + 16 + length])
        assert data_crc == masked(data), "data CRC at %d" % pos
        yield data
        pos += 16 + length


def varint(buf, pos):
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf):
    """(field number, wire type, value) of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise AssertionError("unexpected wire type %d" % wire)
        yield num, wire, value


def decode_event(data):
    event = {"values": {}}
    for num, wire, value in fields(data):
        if num == 1:
            assert wire == 1
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif num == 2:
            assert wire == 0
            event["step"] = value
        elif num == 3:
            assert wire == 2
            event["file_version"] = value.decode()
        elif num == 5:
            assert wire == 2
            for vnum, vwire, v in fields(value):
                assert (vnum, vwire) == (1, 2)
                tag = simple = None
                for f, w, x in fields(v):
                    if (f, w) == (1, 2):
                        tag = x.decode()
                    elif (f, w) == (2, 5):
                        simple = struct.unpack("<f", x)[0]
                assert tag is not None and simple is not None
                event["values"][tag] = simple
        else:
            raise AssertionError("unexpected Event field %d" % num)
    return event


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = prefix + "/" + k if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def as_csv(v):
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    assert crc32c(b"123456789") == 0xE3069283  # the reader's own CRC
    tool = sys.argv[1:]  # the tool and its options
    with tempfile.TemporaryDirectory() as tmp:
        exp = subprocess.run(
            tool + [tmp], check=True, capture_output=True, text=True
        ).stdout.strip()
        assert os.path.isdir(exp), exp

        with open(os.path.join(exp, "result.json")) as f:
            text = f.read()
        assert text.endswith("\n")
        rows = [json.loads(line) for line in text.splitlines()]
        assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4], rows
        assert [r["checkpoint_dir_name"] is not None for r in rows] == [False, True, False, True]
        assert rows[0]["note"] == 'a,b "q"\nline 0'

        with open(os.path.join(exp, "progress.csv"), newline="") as f:
            table = list(csv.DictReader(f))
        assert len(table) == len(rows), table
        for row, line in zip(table, rows):
            flat = flatten(line)
            assert "late" in row  # the widened header covers the early rows too
            for key, value in row.items():
                want = flat.get(key)
                if isinstance(want, float) and value:
                    assert float(value) == want, (key, value, want)
                else:
                    assert value == as_csv(want), (key, value, want)
            assert set(flat) <= set(row), (sorted(flat), sorted(row))

        files = glob.glob(os.path.join(exp, "events.out.tfevents.*"))
        assert len(files) == 1, files
        with open(files[0], "rb") as f:
            events = [decode_event(d) for d in records(f.read())]
        assert events[0]["file_version"] == "brain.Event:2", events[0]
        assert len(events) == 1 + len(rows)
        for event, line in zip(events[1:], rows):
            assert event["step"] == line["training_iteration"], event
            assert abs(event["wall_time"] - line["timestamp"]) < 1.0
            want = {
                k: f32(float(v))
                for k, v in flatten(line).items()
                if isinstance(v, (int, float))
                and not isinstance(v, bool)
                and k not in ("training_iteration", "timestamp", "time_total_s")
            }
            assert event["values"] == want, (event["values"], want)
            assert "eval/inner/n" in event["values"] and "note" not in event["values"]
    print("history reader: ok")


if __name__ == "__main__":
    main()
