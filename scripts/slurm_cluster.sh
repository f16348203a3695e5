#!/usr/bin/env bash
# A real Slurm cluster with accounting on this machine, for tests and CI (docs/distributed.md §9).
#
#   scripts/slurm_cluster.sh start [--nodes N]   install (apt, if missing) and start munge, MariaDB,
#                                      slurmdbd, slurmctld and N slurmd; idempotent. Without
#                                      --nodes: keep the running cluster whatever its size, else
#                                      start one node. --nodes N switches a running cluster of
#                                      another size (its jobs are lost: the controller's state is
#                                      cleared, accounting is kept). STARE_LAB_SLURM_NODES=N
#                                      is the same as --nodes N.
#   scripts/slurm_cluster.sh stop      stop every daemon (by the PIDs in its pid file), end what
#                                      still runs in the nodes' namespaces, remove the namespaces
#   scripts/slurm_cluster.sh status    sinfo and squeue of the running cluster
#   scripts/slurm_cluster.sh env       print `export SLURM_CONF=...`
#   scripts/slurm_cluster.sh exec NODE CMD...   run CMD on NODE (head, node1, ...) of a multi-node
#                                      cluster: in its network and UTS namespaces, with its /etc/hosts
#   scripts/slurm_cluster.sh kill-node NODE     SIGKILL every process of NODE (its slurmd, its jobs'
#                                      tasks): a node that dies. `start` brings its slurmd back.
#
# One node (the default): every daemon in this machine's own namespaces, NodeName = `hostname -s`.
#
# N > 1 nodes: Linux network and UTS namespaces make N hosts node1..nodeN plus `head` (MariaDB,
# slurmdbd, slurmctld): namespace stare-hub holds a bridge, each host's namespace (stare-head,
# stare-node1, ...) a veth to it with the host's address ($NET.254 for head, $NET.i for node i), the
# only addresses the cluster makes; UTS namespaces (bind-mounted under $NS_DIR) give each its hostname;
# $DIR/hosts, bind-mounted at /etc/hosts for whatever runs there, names them all. slurmd runs
# once per node namespace with its own spool, pid file and log (%n). Jobs run in their node's namespaces
# (tasks are slurmd's children), so `srun -N 3 hostname` prints node1..node3 and torch's rendezvous
# crosses the bridge. Clients in this machine's own namespaces (sbatch, squeue, sacct, submitit's
# driver) have no route into the namespaces: 127.0.0.1:6817 (slurmctld) and :6819 (slurmdbd) are socat
# relays through a Unix socket to head's own 127.0.0.1, in this machine's loopback and in each node's
# (so one slurm.conf names the controller for everyone, as on one node). srun needs the nodes to reach
# it back: run it on a node (`exec node1 srun ...`, or inside a job), not from this machine's shell.
#
# Everything lives in $STARE_LAB_SLURM_DIR (default /tmp/stare_lab_slurm): slurm.conf,
# slurmdbd.conf (mode 600), the MariaDB datadir, state, spool, logs, pid files, relay sockets. Clients
# (sinfo, sbatch, sacct and submitit's subprocesses) need SLURM_CONF=$DIR/slurm.conf: `start` prints
# the export line last, so `eval "$(scripts/slurm_cluster.sh start --nodes 3 | tail -1)"` works.
# Runs as root (SlurmUser=root); the sandbox has no cgroups, hence linuxproc/none plugins.
set -euo pipefail

DIR="${STARE_LAB_SLURM_DIR:-/tmp/stare_lab_slurm}"
CLUSTER=stare
DB_PORT="${STARE_LAB_SLURM_DB_PORT:-3306}"
DB_PASS=stare_lab_slurm
CONF="$DIR/slurm.conf"
NET="${STARE_LAB_SLURM_NET:-10.77.0}"  # the namespaces' /24: head .254, node i .i
NS_DIR=/run/stare_lab_slurm_ns         # persistent UTS namespaces (bind mounts)
HUB=stare-hub
# A node that stops answering is DOWN after this long (Slurm's default 300 s): a job on it then
# ends NODE_FAIL within a test's patience.
SLURMD_TIMEOUT="${STARE_LAB_SLURMD_TIMEOUT:-20}"
export SLURM_CONF="$CONF"

log() { echo "[slurm_cluster] $*" >&2; }

pid_alive() {  # pid file → 0 when its process is alive
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_for() {  # seconds, description, command...
    local secs=$1 what=$2; shift 2
    for _ in $(seq $((secs * 5))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    log "timed out after ${secs}s waiting for $what"
    return 1
}

running_nodes() {  # node count of the cluster whose controller runs, else 0
    if pid_alive "$DIR/slurmctld.pid"; then cat "$DIR/nodes" 2>/dev/null || echo 1; else echo 0; fi
}

node_names() { local n=$1; for i in $(seq "$n"); do echo "node$i"; done; }

# -- namespaces ----------------------------------------------------------------------------------

# HOST CMD...: run CMD in HOST's network and UTS namespaces, with $DIR/hosts as its /etc/hosts (in a
# mount namespace of its own that still receives this machine's mounts); every step execs, so a
# background `on ... &` has CMD's pid in $!
ON=(nsenter --net=/run/netns/stare-HOST --uts="$NS_DIR/HOST.uts" -- unshare --mount --propagation slave --
    sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$DIR/hosts")
on_cmd() { local w; for w in "${ON[@]}"; do printf '%s\0' "${w//HOST/$1}"; done; }
on() {
    local host=$1 prefix=(); shift
    mapfile -d '' prefix < <(on_cmd "$host")
    "${prefix[@]}" "$@"
}

make_host() {  # HOST ADDRESS: its namespaces, a veth to the hub's bridge, its address, its hostname
    local host=$1 addr=$2 ns="stare-$1"
    if ! ip netns list | grep -qw "$ns"; then
        ip netns add "$ns"
        ip -n "$HUB" link add "v-$host" type veth peer name eth0 netns "$ns"
        ip -n "$HUB" link set "v-$host" master br0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
    fi
    if ! mountpoint -q "$NS_DIR/$host.uts" 2>/dev/null; then
        touch "$NS_DIR/$host.uts"
        unshare --uts="$NS_DIR/$host.uts" hostname "$host"
    fi
}

make_network() {  # N
    local n=$1 hosts
    mkdir -p "$NS_DIR"
    if ! mountpoint -q "$NS_DIR"; then mount --bind "$NS_DIR" "$NS_DIR" && mount --make-private "$NS_DIR"; fi
    if ! ip netns list | grep -qw "$HUB"; then
        ip netns add "$HUB"
        ip -n "$HUB" link add br0 type bridge
        ip -n "$HUB" link set br0 up
    fi
    hosts="127.0.0.1 localhost
$NET.254 head"
    for i in $(seq "$n"); do hosts+=$'\n'"$NET.$i node$i"; done
    make_host head "$NET.254"
    for i in $(seq "$n"); do make_host "node$i" "$NET.$i"; done
    echo "$hosts" >"$DIR/hosts"
}

relay() {  # NAME HOST PORT: 127.0.0.1:PORT in HOST's namespaces ("root": this machine's) → head's 127.0.0.1:PORT
    local name=$1 host=$2 port=$3 prefix=()
    local sock="$DIR/run/$name.sock" pidf="$DIR/run/relay-$name-$host.pid"
    pid_alive "$pidf" && return
    [[ $host == root ]] || mapfile -d '' prefix < <(on_cmd "$host")
    if [[ $host == head ]]; then
        "${prefix[@]}" socat "UNIX-LISTEN:$sock,fork,unlink-early" "TCP:127.0.0.1:$port" >>"$DIR/log/relay.log" 2>&1 &
        echo $! >"$pidf"
        wait_for 10 "relay socket $sock" test -S "$sock"
    else
        "${prefix[@]}" socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$sock" \
            >>"$DIR/log/relay.log" 2>&1 &
        echo $! >"$pidf"
    fi
}

relays() {  # HOST...: the controller's and slurmdbd's relays in those hosts' namespaces
    for h in "$@"; do relay ctld "$h" 6817; relay dbd "$h" 6819; done
}

# -- daemons -------------------------------------------------------------------------------------

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v mariadbd >/dev/null || missing+=(mariadb-server)
    command -v socat >/dev/null || missing+=(socat)
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

start_munge() {  # one munged for every host: its socket is a file, seen from every namespace
    if pid_alive /run/munge/munged.pid; then return; fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    fi
    su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=/run/munge/munged.pid" \
        || runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    wait_for 10 munge sh -c 'munge -n | unmunge'
}

start_mariadb() {  # PREFIX...: how to run a command on the controller's host (nothing: here)
    local datadir="$DIR/mysql" sock="$DIR/mysql.sock"
    if pid_alive "$DIR/mariadb.pid"; then return; fi
    if [[ ! -d "$datadir/mysql" ]]; then
        mariadb-install-db --user=root --datadir="$datadir" --auth-root-authentication-method=socket \
            >"$DIR/log/mariadb-install.log" 2>&1
    fi
    nohup "$@" mariadbd --user=root --datadir="$datadir" --socket="$sock" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --pid-file="$DIR/mariadb.pid" --skip-name-resolve \
        --innodb-buffer-pool-size=64M --log-error="$DIR/log/mariadb.log" >/dev/null 2>&1 &
    wait_for 30 mariadb mariadb --socket="$sock" -e "select 1"
    mariadb --socket="$sock" <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL
}

node_line() {  # NAME: this machine's `slurmd -C` line for a node called NAME, CPUs ≥ $STARE_LAB_SLURM_CPUS
    local name=$1 node cpus mem
    node=$(slurmd -C | head -1)
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
    mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    mem=$((mem > 4096 ? mem - 2048 : mem / 2))  # more than slurmd -C reports drains the node
    node=$(sed "s/RealMemory=[0-9]*/RealMemory=$mem/; s/NodeName=[^ ]*/NodeName=$name/" <<<"$node")
    # A multi-process run is one job of 2+ tasks (one CPU each), beside other tests' jobs: declare
    # at least $STARE_LAB_SLURM_CPUS (default 4) CPUs, oversubscribing the cores (the tests keep
    # one torch thread per task); config_overrides keeps slurmd from draining the node for it.
    local want=${STARE_LAB_SLURM_CPUS:-4}
    if ((cpus < want)); then
        node=$(sed "s/CPUs=[0-9]*/CPUs=$want/; s/SocketsPerBoard=[0-9]*/SocketsPerBoard=1/;
                    s/CoresPerSocket=[0-9]*/CoresPerSocket=$want/; s/ThreadsPerCore=[0-9]*/ThreadsPerCore=1/" <<<"$node")
    fi
    echo "$node"
}

write_configs() {  # N
    local n=$1 ctl nodes partition pidfile spool logfile timeout="" i
    if ((n == 1)); then
        ctl=$(hostname -s)
        nodes="$(node_line "$ctl") State=UNKNOWN"
        partition=$ctl
        pidfile=$DIR/slurmd.pid spool=$DIR/spool logfile=$DIR/log/slurmd.log
    else
        ctl="head(127.0.0.1)"  # every namespace's 127.0.0.1:6817 leads to head's slurmctld (relays)
        nodes=""
        for i in $(seq "$n"); do nodes+="$(node_line "node$i") NodeAddr=$NET.$i State=UNKNOWN"$'\n'; done
        partition="node[1-$n]"
        pidfile="$DIR/slurmd-%n.pid" spool="$DIR/spool/%n" logfile="$DIR/log/slurmd-%n.log"
        timeout="SlurmdTimeout=$SLURMD_TIMEOUT"
    fi
    cat >"$CONF" <<EOF
# Generated by scripts/slurm_cluster.sh: a $n-node cluster for stare_lab's tests.
ClusterName=$CLUSTER
SlurmctldHost=$ctl
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$pidfile
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$logfile
# No usable cgroups in the sandbox.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
# Snappy tests: short kill grace, quick requeue, completed jobs leave squeue fast.
KillWait=5
MinJobAge=30
JobRequeue=1
$timeout
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
${nodes%$'\n'}
PartitionName=debug Nodes=$partition Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    local dbd_host
    dbd_host=$( ((n == 1)) && echo localhost || echo head)
    cat >"$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$dbd_host
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/slurmdbd.conf"
    echo "$n" >"$DIR/nodes"
    log "$n node(s): $(node_line x | sed -n 's/.*\(CPUs=[0-9]*\).*\(RealMemory=[0-9]*\).*/\1 \2/p') each"
}

start_controller() {  # PREFIX...: slurmdbd, the cluster in accounting, slurmctld (on head when PREFIX)
    if ! pid_alive "$DIR/slurmdbd.pid"; then
        "$@" slurmdbd  # reads slurmdbd.conf next to $SLURM_CONF
        wait_for 30 slurmdbd sacctmgr -n list cluster
    fi
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
    if ! pid_alive "$DIR/slurmctld.pid"; then "$@" slurmctld -f "$CONF"; fi
    wait_for 30 slurmctld scontrol ping
}

start_one() {
    start_mariadb
    if ! pid_alive "$DIR/slurmctld.pid"; then write_configs 1; fi
    start_controller
    if ! pid_alive "$DIR/slurmd.pid"; then slurmd -f "$CONF"; fi
    wait_for 30 "an idle node" sh -c "sinfo -h -o %t | grep -Eq '^(idle|mix|alloc)'"
}

start_node() {  # NAME: its relays and its slurmd (again, after kill-node)
    local node=$1
    relays "$node"
    if ! pid_alive "$DIR/slurmd-$node.pid"; then on "$node" slurmd -f "$CONF" -N "$node"; fi
}

start_many() {  # N
    local n=$1
    make_network "$n"
    mkdir -p "$DIR/run" "$DIR/spool"
    for node in $(node_names "$n"); do mkdir -p "$DIR/spool/$node"; done
    local head=()
    mapfile -d '' head < <(on_cmd head)
    start_mariadb "${head[@]}"
    if ! pid_alive "$DIR/slurmctld.pid"; then write_configs "$n"; fi
    relays head
    relays root
    start_controller "${head[@]}"
    for node in $(node_names "$n"); do start_node "$node"; done
    up() { [[ $(sinfo -h -N -o '%N %t' | grep -Ec ' (idle|mix|alloc)$') -eq $n ]]; }
    wait_for 60 "$n idle nodes" up
}

start() {
    local want=${1:-}
    install_packages
    mkdir -p "$DIR"/{state,spool,log,run}
    start_munge
    local have
    have=$(running_nodes)
    if [[ -z $want ]]; then want=$((have > 0 ? have : 1)); fi
    if ((have > 0 && have != want)); then
        log "switching the running $have-node cluster to $want node(s): its queued jobs are dropped"
        stop
        rm -rf "$DIR/state"
        mkdir -p "$DIR/state"
    fi
    if ((want == 1)); then start_one; else start_many "$want"; fi
    log "up: $(sinfo -h -o '%P %D %t %c cpus %m MB')"
    echo "export SLURM_CONF=$CONF"
}

stop_pidfile() {  # read the pid before killing: the daemons delete their pid file on exit
    local f=$1 pid
    [[ -s "$f" ]] || return 0
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
}

stop_relay() {  # a socat relay holds no state: SIGKILL it and the children serving its connections
    local f=$1 pid
    pid=$(cat "$f" 2>/dev/null) || return 0
    if [[ -n $pid ]]; then kill -9 $(pgrep -P "$pid") "$pid" 2>/dev/null || true; fi
    rm -f "$f"
}

kill_namespace() {  # NS: SIGKILL what still runs in it (by pid)
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
}

stop() {
    local f ns t0=$SECONDS
    for f in "$DIR"/slurmd-*.pid; do [[ -e $f ]] && stop_pidfile "$f" & done  # the nodes at once
    wait
    for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/slurmdbd.pid" "$DIR/mariadb.pid"; do
        [[ -e $f ]] && stop_pidfile "$f"
        [[ -n ${STARE_LAB_SLURM_DEBUG:-} ]] && log "$(basename "$f"): $((SECONDS - t0))s"
    done
    for f in "$DIR"/run/relay-*.pid; do [[ -e $f ]] && stop_relay "$f"; done
    [[ -n ${STARE_LAB_SLURM_DEBUG:-} ]] && log "relays: $((SECONDS - t0))s"
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^stare-' || true); do
        kill_namespace "$ns"  # jobs' tasks left behind
        ip netns del "$ns"
    done
    if [[ -d $NS_DIR ]]; then
        for f in "$NS_DIR"/*.uts; do [[ -e $f ]] && { umount "$f" 2>/dev/null || true; rm -f "$f"; }; done
        umount "$NS_DIR" 2>/dev/null || true
        rmdir "$NS_DIR" 2>/dev/null || true
    fi
    rm -f "$DIR"/run/*.sock
    log "stopped (munge left running; state kept in $DIR)"
}

kill_node() {  # NAME: SIGKILL every process in the node's namespaces (slurmd, slurmstepd, tasks, relays)
    local node=$1
    ip netns list | grep -qw "stare-$node" || { echo "kill-node: no node $node in this cluster" >&2; exit 2; }
    kill_namespace "stare-$node"
    rm -f "$DIR/slurmd-$node.pid" "$DIR"/run/relay-*-"$node".pid
    log "killed $node"
}

usage() { echo "usage: $0 start [--nodes N] | stop | status | env | exec NODE CMD... | kill-node NODE" >&2; exit 2; }

case "${1:-start}" in
    start)
        nodes="${STARE_LAB_SLURM_NODES:-}"
        if [[ ${2:-} == --nodes ]]; then nodes=${3:-}; elif [[ ${2:-} == --nodes=* ]]; then nodes=${2#--nodes=}; elif [[ -n ${2:-} ]]; then usage; fi
        if [[ -n $nodes ]] && ! [[ $nodes =~ ^[1-9][0-9]?$ && $nodes -le 50 ]]; then
            echo "slurm_cluster.sh: --nodes must be 1..50, got '$nodes'" >&2; exit 2
        fi
        start "$nodes" ;;
    stop) stop ;;
    status) sinfo && squeue ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    exec) [[ -n ${2:-} && -n ${3:-} ]] || usage; host=$2; shift 2; on "$host" "$@" ;;
    kill-node) [[ -n ${2:-} ]] || usage; kill_node "$2" ;;
    *) usage ;;
esac
