#!/bin/bash
# A Slurm cluster for a test: munged, slurmctld and slurmd from Debian's
# slurm-wlm packages, configured in DIR (its own ports, sockets, state and
# logs; nothing under /etc is changed), then COMMAND run with SLURM_CONF
# pointing at it, then everything stopped. Exits with COMMAND's status; 77
# when Slurm is not installed or this is not root (slurmd starts tasks as
# their user, and munged must run as the same user).
#
#   tests/train/slurm_cluster.sh DIR srun -n 2 ./program ...
#   NODES=2 tests/train/slurm_cluster.sh DIR srun -N 2 -n 2 ./program ...
#
# One node (NODES unset or 1) is this host. With NODES=n the cluster has n
# nodes cairn-slurm0..n-1 on this machine: one slurmd each, in a UTS
# namespace of its own whose host name is the node's (so its tasks see
# that name), at a port of its own; they share the network and the file
# systems. Their names do not resolve: a step's processes must reach the
# first node at 127.0.0.1 (MASTER_ADDR=127.0.0.1 for the Trainer).
#
# Each node offers CPUS (2 unless set) CPUs, oversubscribed 4 times, so
# steps of more tasks than cores run. Waits are bounded:
# munged 30 s to make its socket and the node 90 s to come up (bounds for a loaded
# machine, not timings), COMMAND runs under the caller's own time limit.
set -u
dir=$1
shift
for tool in munged slurmctld slurmd srun sinfo; do
  command -v "$tool" > /dev/null || { echo "slurm_cluster: $tool is not installed" >&2; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "slurm_cluster: needs root" >&2; exit 77; }
[ -r /etc/munge/munge.key ] || { echo "slurm_cluster: no /etc/munge/munge.key" >&2; exit 77; }

nodes=${NODES:-1}
mkdir -p "$dir/state"
# One node: its name is the host name, as slurmd finds it, when it resolves:
# the ranks reach rank 0 at the first name of the step's node list. Where it
# does not (some containers), the node is "localhost", named to slurmd.
node=$(hostname -s)
getent hosts "$node" > /dev/null 2>&1 || node=localhost
names=("$node")
if [ "$nodes" -gt 1 ]; then
  names=()
  for i in $(seq 0 $((nodes - 1))); do names+=("cairn-slurm$i"); done
fi
for n in "${names[@]}"; do mkdir -p "$dir/spool/$n"; done
# Ports of its own, free when checked: below the kernel's ephemeral range
# (32768 and up), where the port-0 sockets of tests running beside this one
# land, and above the Trainer's Slurm control ports (15000-29999).
read -r ctld_port slurmd_ports < <(python3 - "$((nodes + 1))" << 'EOF'
import random
import socket
import sys
picked = []
for port in random.sample(range(30000, 32700), 200):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    picked.append(port)
    if len(picked) == int(sys.argv[1]):
        break
print(picked[0], " ".join(map(str, picked[1:])))
EOF
)
read -r -a slurmd_port <<< "$slurmd_ports"
cat > "$dir/slurm.conf" << EOF
ClusterName=cairntest
# Job ids from a random start: the Trainer's control port derives from them,
# so two clusters of this script do not hand out the same one.
FirstJobId=$((RANDOM + 1))
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=${slurmd_port[0]}
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
EOF
for i in "${!names[@]}"; do
  echo "NodeName=${names[$i]} NodeAddr=127.0.0.1 Port=${slurmd_port[$i]} CPUs=${CPUS:-2}" \
    "RealMemory=1000 State=UNKNOWN" >> "$dir/slurm.conf"
done
all=$(IFS=,; echo "${names[*]}")
echo "PartitionName=test Nodes=$all Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" \
  >> "$dir/slurm.conf"
export SLURM_CONF=$dir/slurm.conf

pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$p" 2> /dev/null
  done
  wait 2> /dev/null
}
trap stop EXIT

munged --force --foreground --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge.seed" > "$dir/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -S "$dir/munge.sock" ] && break; sleep 0.1; done
if [ ! -S "$dir/munge.sock" ]; then
  echo "slurm_cluster: munged made no socket within 30 s; its log:" >&2
  tail -n 20 "$dir/munged.log" "$dir/munged.out" >&2
  exit 1
fi
slurmctld -D -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
pids+=($!)
if [ "$nodes" -gt 1 ]; then
  for n in "${names[@]}"; do
    unshare --uts sh -c 'hostname "$1" && exec slurmd -D -N "$1" -f "$SLURM_CONF"' sh "$n" \
      > "$dir/slurmd-$n.out" 2>&1 &
    pids+=($!)
  done
else
  slurmd -D -N "$node" -f "$SLURM_CONF" > "$dir/slurmd-$node.out" 2>&1 &
  pids+=($!)
fi
up=
for _ in $(seq 900); do
  if [ "$(sinfo -h -N -o %t 2> /dev/null | grep -cx idle)" = "$nodes" ]; then up=1; break; fi
  sleep 0.1
done
if [ -z "$up" ]; then
  echo "slurm_cluster: the nodes did not come up within 90 s; logs:" >&2
  tail -n 20 "$dir"/*.log "$dir"/*.out >&2
  exit 1
fi
"$@"
