#!/usr/bin/env bash
# The life cycle of scripts/slurm_cluster.sh, checked (run by .ci/run after the tests; it leaves the
# cluster stopped, or as it found it with --restore N):
#   1. `stop` leaves nothing it made: no stare-* namespace, no UTS bind mount, no daemon or relay alive,
#      no process naming the cluster's folder, nothing listening on 127.0.0.1:6817/6819;
#   2. `start` (no --nodes, nothing running) is one node, named after this host, and prints the
#      `export SLURM_CONF=...` line last; `stop` again leaves nothing;
#   3. `start --nodes 3` from nothing: three idle nodes in under a minute; `stop` leaves nothing.
# Prints each step's time; exits 1 naming what was left or wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${STARE_LAB_SLURM_DIR:-/tmp/stare_lab_slurm}"
CLUSTER=scripts/slurm_cluster.sh
export SLURM_CONF="$DIR/slurm.conf"
restore=""
[[ ${1:-} == --restore ]] && restore=${2:?--restore needs a node count}

fail() { echo "slurm_cluster_check: $*" >&2; exit 1; }

leftovers() {  # what a stopped cluster must not leave: one line each
    local f pid
    ip netns list 2>/dev/null | awk '{print $1}' | grep '^stare-' | sed 's/^/namespace /' || true
    mountpoint -q /run/stare_lab_slurm_ns 2>/dev/null && echo "mount /run/stare_lab_slurm_ns"
    for f in "$DIR"/*.pid "$DIR"/run/*.pid; do
        [[ -s $f ]] || continue
        pid=$(cat "$f")
        kill -0 "$pid" 2>/dev/null && echo "process $pid of $f"
    done
    pgrep -af -- "$DIR" | grep -v -e slurm_cluster_check -e "pgrep" | sed 's/^/process /' || true
    ss -ltnH 2>/dev/null | awk '{print $4}' | grep -E '^127\.0\.0\.1:(6817|6819)$' | sed 's/^/listening /' || true
    return 0
}

check_clean() {  # WHEN
    local left
    left=$(leftovers)
    [[ -z $left ]] || fail "after $1, left behind:"$'\n'"$left"
}

timed() {  # COMMAND...: its stdout in $OUT, its time in $SECS (and $MS)
    local t0
    t0=$(date +%s%N)
    OUT=$("$@")
    MS=$((($(date +%s%N) - t0) / 1000000))
    SECS=$(printf '%d.%01d' $((MS / 1000)) $((MS % 1000 / 100)))
}

timed $CLUSTER stop
check_clean "stop"
echo "stop: ${SECS}s, nothing left"

timed $CLUSTER start
[[ $(tail -1 <<<"$OUT") == "export SLURM_CONF=$DIR/slurm.conf" ]] || fail "start did not print the export line last: $OUT"
nodes=$(sinfo -h -N -o '%N %t')
[[ $nodes == "$(hostname -s) idle" ]] || fail "the default start is not one idle node named $(hostname -s): $nodes"
echo "start (default): ${SECS}s, $nodes"
timed $CLUSTER stop
check_clean "stopping one node"

timed $CLUSTER start --nodes 3
[[ $(tail -1 <<<"$OUT") == "export SLURM_CONF=$DIR/slurm.conf" ]] || fail "start --nodes 3: no export line last: $OUT"
nodes=$(sinfo -h -N -o '%N:%t' | tr '\n' ' ')
[[ $nodes == "node1:idle node2:idle node3:idle " ]] || fail "start --nodes 3: $nodes"
((MS < 60000)) || fail "start --nodes 3 took ${SECS}s (more than a minute)"
echo "start --nodes 3: ${SECS}s, $nodes"
timed $CLUSTER stop
check_clean "stopping three nodes"
echo "stop (3 nodes): ${SECS}s, nothing left"

if [[ -n $restore ]]; then $CLUSTER start --nodes "$restore" | tail -1; fi
