#!/usr/bin/env bash
# A single-node Ceph S3 gateway (radosgw, Debian 12's Ceph 16.2) on 127.0.0.1,
# for the tests: one monitor, one OSD keeping its objects in memory
# (memstore), no cephx authentication between the daemons, and radosgw's beast
# frontend. Nothing is written outside DIR, and nothing listens beyond
# 127.0.0.1.
#
#   radosgw.sh install            installs the Debian packages (as
#                                 scripts/install-deps.sh does)
#   radosgw.sh start DIR PORT     brings it up with S3 on 127.0.0.1:PORT, a user
#                                 with the access key and secret of
#                                 CAIRN_RGW_ACCESS_KEY / CAIRN_RGW_SECRET_KEY
#                                 (default cairn / cairn-secret) and the
#                                 bucket CAIRN_RGW_BUCKET (default cairn-test);
#                                 prints "ready" once S3 answers
#   radosgw.sh start-shared DIR   the same on a free port, written to DIR/endpoint
#                                 (a CTest fixture's setup)
#   radosgw.sh stop DIR           stops every daemon started in DIR (by the
#                                 pids they wrote there) and removes DIR
#
# Differences from a production setup, on purpose: parts down to 256 KiB are
# accepted (rgw_multipart_min_part_size; S3's minimum is 5 MiB) so that the
# tests take the multipart path with small objects, and the OSD holds 1 GiB at
# most, in memory.
set -euo pipefail

packages=(ceph-mon ceph-osd radosgw ceph-common)

install() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  local pidfile pid
  for pidfile in "$dir"/run/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

start() {
  local dir=$1 port=$2
  local access=${CAIRN_RGW_ACCESS_KEY:-cairn} secret=${CAIRN_RGW_SECRET_KEY:-cairn-secret}
  local bucket=${CAIRN_RGW_BUCKET:-cairn-test}
  command -v radosgw >/dev/null 2>&1 || install
  mkdir -p "$dir"/run "$dir"/log "$dir"/mon "$dir"/osd0 "$dir"/rgw
  local mon_port fsid conf=$dir/ceph.conf
  mon_port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
ms bind ipv6 = false
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 1073741824
osd max object name len = 460
osd max object namespace len = 64
run dir = $dir/run
admin socket =
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
keyring = /dev/null
[mon.a]
mon data = $dir/mon
[osd.0]
osd data = $dir/osd0
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$port
rgw data = $dir/rgw
rgw multipart min part size = 262144
rgw enable usage log = false
EOF
  monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >>"$dir/log/setup.log" 2>&1
  ceph-mon -c "$conf" -i a >>"$dir/log/setup.log" 2>&1
  ceph -c "$conf" osd create >>"$dir/log/setup.log" 2>&1
  ceph-osd -c "$conf" -i 0 --mkfs >>"$dir/log/setup.log" 2>&1
  ceph-osd -c "$conf" -i 0 >>"$dir/log/setup.log" 2>&1
  radosgw -c "$conf" -n client.rgw >>"$dir/log/setup.log" 2>&1
  radosgw-admin -c "$conf" -n client.rgw user create --uid=cairn --display-name=cairn \
    --access-key="$access" --secret="$secret" >>"$dir/log/setup.log" 2>&1
  # The bucket, with a signed request (botocore, which the tests already use
  # as SigV4's oracle), once the gateway answers.
  local i
  for i in $(seq 1 300); do
    if python3 - "http://127.0.0.1:$port" "$access" "$secret" "$bucket" >>"$dir/log/setup.log" 2>&1 <<'PY'; then
import sys
import botocore.session
from botocore.config import Config

endpoint, access, secret, bucket = sys.argv[1:5]
client = botocore.session.get_session().create_client(
    "s3", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id=access,
    aws_secret_access_key=secret,
    config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
try:
    client.create_bucket(Bucket=bucket)
except client.exceptions.BucketAlreadyOwnedByYou:
    pass
PY
      echo ready
      return 0
    fi
    sleep 0.2
  done
  echo "radosgw did not answer on 127.0.0.1:$port; logs in $dir/log" >&2
  tail -n 20 "$dir"/log/*.log >&2 || true
  return 1
}

# For a CTest fixture: one gateway for every radosgw test of a run, in DIR
# (whatever an interrupted run left there is stopped first); its port goes
# to DIR/endpoint, which tests/support/s3_server.cc reads.
start_shared() {
  local dir=$1 port
  stop "$dir"
  port=$(free_port)
  start "$dir" "$port"
  echo "$port" >"$dir/endpoint"
}

case "${1:-}" in
  install) install ;;
  start) start "$2" "$3" ;;
  start-shared) start_shared "$2" ;;
  stop) stop "$2" ;;
  *)
    echo "usage: $0 install | start DIR PORT | start-shared DIR | stop DIR" >&2
    exit 2
    ;;
esac
