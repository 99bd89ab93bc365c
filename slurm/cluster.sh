#!/usr/bin/env bash
# A private Slurm cluster of 3 nodes on this machine, for ddpjob's tests and for trying the Slurm target.
#
#   slurm/cluster.sh up [--no-accounting] [--apart|--together]
#                                           install packages if missing, start (idempotent)
#   slurm/cluster.sh down [--purge]         stop what this script started (--purge: delete its state)
#   slurm/cluster.sh status                 which daemons run (exit 0 all up, 1 partly, 3 none)
#   slurm/cluster.sh link NODE down|up      apart mode: cut or restore a node's network link (up: its
#                                           slurmd registers again at once)
#   eval "$(slurm/cluster.sh env)"          point sbatch/squeue/sacct/ddpjob at this cluster
#
# Everything lives under $DDPJOB_SLURM_ROOT (default ${TMPDIR:-/tmp}/ddpjob-slurm) and listens on
# private ports from $SLURM_TEST_PORT (default 16817: slurmctld 16817, slurmd n1/n2/n3 16818-16820,
# slurmdbd +100 = 16917, MariaDB +101 = 16918). Nodes n1, n2 and n3 run as three slurmd on
# 127.0.77.1-3, each in its own UTS namespace so jobs see distinct hostnames; the names go into
# /etc/hosts inside a marked block that `down` removes. Needs root (apt, /etc/hosts).
# Partitions: `debug` (the default) has n1 and n2, `three` all three nodes (a job of 3 nodes, or
# one that must be able to lose its first node and keep a majority, asks for it: -p three).
#
# `srun --container=BUNDLE` runs OCI bundles with runc (oci.conf in $ROOT/etc).
#
# --apart: nodes that are really apart. Each slurmd (and every process of its jobs) lives in its own
# network namespace (ddpjob-$PORT-n1, -n2, -n3) with one interface, eth0, on a private bridge this script
# creates (ddpbr$PORT, 10.X.77.0/24 with X from the port, or $DDPJOB_SLURM_SUBNET as A.B.C): n1 is
# .1, n2 .2, n3 .3, the controller and the submitting side .254. No route leads anywhere else, so nothing
# leaves this machine. Each node sees its own /etc/hosts (a private mount namespace) naming the
# nodes by those addresses; the machine's /etc/hosts is not touched. --together goes back to the
# loopback layout. The mode is kept in $ROOT/etc/mode; `up` without either keeps it. Switching
# restarts slurmctld and the slurmds (running jobs are lost).
#
# Exit codes: 0 ok, 1 a daemon failed (the message names the log to read), 2 bad usage,
# 4 the packages are missing and cannot be installed (not root, no apt, apt failed), 5 --apart
# cannot make its network here (no network namespaces, bridges or veths on this kernel).
set -euo pipefail

ROOT=${DDPJOB_SLURM_ROOT:-${TMPDIR:-/tmp}/ddpjob-slurm}
BASE=${SLURM_TEST_PORT:-16817}
case "$BASE" in ''|*[!0-9]*) echo "slurm/cluster.sh: SLURM_TEST_PORT must be a number" >&2; exit 2 ;; esac
CTLD_PORT=$BASE
N1_PORT=$((BASE + 1))
N2_PORT=$((BASE + 2))
N3_PORT=$((BASE + 3))
DBD_PORT=$((BASE + 100))
DB_PORT=$((BASE + 101))
CLUSTER=ddptest
CONF=$ROOT/etc/slurm.conf
MUNGE_SOCK=$ROOT/munge-run/munge.sock
HOSTS_BEGIN="# BEGIN ddpjob-slurm ($ROOT)"
HOSTS_END="# END ddpjob-slurm ($ROOT)"
DB_PASS=ddpjob-slurm-test
NODES="n1 n2 n3"
export SLURM_CONF=$CONF
# Apart mode's network: names are short enough for Linux's 15-character interface names.
NET=${DDPJOB_SLURM_SUBNET:-10.$((100 + BASE % 100)).77}
case "$NET" in *[!0-9.]*|'') echo "slurm/cluster.sh: DDPJOB_SLURM_SUBNET must look like 10.1.2" >&2; exit 2 ;; esac
BRIDGE=ddpbr$BASE
CTL_ADDR=$NET.254
netns_of() { echo "ddpjob-$BASE-$1"; }
veth_of() { echo "dv$BASE$1"; }
node_addr() { echo "$NET.${1#n}"; }
node_addrs() { local n out=""; for n in $NODES; do out="$out${out:+, }$n $(node_addr "$n")"; done; echo "$out"; }

log() { printf 'slurm/cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The pid in a pid file ("" if none; a daemon may delete its file while we read it).
read_pid() { { tr -dc '0-9' < "$1"; } 2>/dev/null || true; }

# A pid is ours only if it runs (not a zombie: this VM's init reaps lazily) under the expected name.
pid_alive() {
  local pid
  pid=$(read_pid "$1")
  [ -n "$pid" ] && proc_alive "$pid" "$2"
}

# Same check for a bare pid (a daemon we just launched, before it writes its pid file).
proc_alive() {
  local pid=$1 name=$2 stat state
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ "$stat" == *"($name)"* ]] || return 1
  state=${stat##*) }
  state=${state%% *}
  [ "$state" != Z ] && [ "$state" != X ]
}

stop_pid() {
  local pidfile=$1 name=$2 pid _
  pid=$(read_pid "$pidfile")
  if [ -z "$pid" ] || ! proc_alive "$pid" "$name"; then rm -f "$pidfile"; return 0; fi
  kill -TERM "$pid" 2>/dev/null || true
  # Watch the pid itself: some daemons delete their pid file before they are gone.
  for _ in $(seq 1 100); do proc_alive "$pid" "$name" || break; sleep 0.1; done
  if proc_alive "$pid" "$name"; then
    log "$name (pid $pid) ignored SIGTERM for 10s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do proc_alive "$pid" "$name" || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

wait_for() {  # wait_for SECONDS DESCRIPTION LOGFILE COMMAND...
  local secs=$1 what=$2 logfile=$3 _
  shift 3
  for _ in $(seq 1 $((secs * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what did not come up within ${secs}s; read $logfile"
}

# ------------------------------------------------------------------------------------------ packages

need_cmds="slurmctld slurmd sbatch srun sinfo scontrol sacct sacctmgr munged munge unmunge slurmdbd mariadbd mariadb mariadb-install-db unshare runuser runc"
# runc: the OCI runtime of `srun --container` (oci_conf below)
PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server runc)
MADE_POLICY=0

missing_cmds() {
  local cmd out=""
  for cmd in $need_cmds; do
    PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" >/dev/null 2>&1 || out="$out $cmd"
  done
  printf '%s' "$out"
}

cleanup_policy() {
  if [ "$MADE_POLICY" = 1 ]; then rm -f /usr/sbin/policy-rc.d; MADE_POLICY=0; fi
}

install_packages() {
  local missing aptlog
  missing=$(missing_cmds)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    log "error: missing$missing; installing Debian's packages (${PKGS[*]}) needs root"; exit 4
  fi
  command -v apt-get >/dev/null 2>&1 || { log "error: missing$missing and there is no apt-get"; exit 4; }
  log "installing Debian's Slurm, munge and MariaDB packages (missing:$missing)"
  mkdir -p "$ROOT/log"
  aptlog=$ROOT/log/apt.log
  : > "$aptlog"
  # Keep apt from starting the system's own munge/mariadb/slurm: only this script's private ones run.
  # This image has a policy-rc.d already; elsewhere one is created for the install and removed after.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap cleanup_policy EXIT
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    MADE_POLICY=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when the package lists do not know the packages yet (fresh image) or are stale.
  # An install waits up to 5 minutes for dpkg's lock (another install, unattended-upgrades).
  if ! apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${PKGS[@]}" >>"$aptlog" 2>&1; then
    if ! { apt-get update -q >>"$aptlog" 2>&1 \
           && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${PKGS[@]}" >>"$aptlog" 2>&1; }; then
      cleanup_policy
      tail -n 15 "$aptlog" >&2
      log "error: apt-get could not install ${PKGS[*]}; read $aptlog"
      exit 4
    fi
  fi
  cleanup_policy
  missing=$(missing_cmds)
  [ -z "$missing" ] || { log "error: still missing after apt-get:$missing; read $aptlog"; exit 4; }
}

# -------------------------------------------------------------------------------------------- config

# Prints slurm.conf for accounting on (1) or off (0).
slurm_conf() {
  local accounting=$1 mode=$2 ctl=127.0.0.1 a1=127.0.77.1 a2=127.0.77.2 a3=127.0.77.3
  if [ "$mode" = apart ]; then ctl=$CTL_ADDR; a1=$(node_addr n1); a2=$(node_addr n2); a3=$(node_addr n3); fi
  cat <<EOF
# Written by slurm/cluster.sh; private to $ROOT. Regenerated on every 'up'. Mode: $mode.
ClusterName=$CLUSTER
SlurmctldHost=localhost($ctl)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/slurmd-%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
KillWait=5
SlurmdTimeout=30
MinJobAge=600
InactiveLimit=0
JobRequeue=1
JobCompType=jobcomp/none
EOF
  if [ "$accounting" = 1 ]; then
    cat <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$ctl
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
EOF
  else
    cat <<EOF
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
EOF
  fi
  # 8 CPUs (cores) and 8 GiB per node whatever the machine has (config_overrides): several small
  # jobs, e.g. two 2-node jobs at once, fit side by side. Memory is not a consumable (CR_Core).
  cat <<EOF
NodeName=n1 NodeHostname=n1 NodeAddr=$a1 Port=$N1_PORT CPUs=8 RealMemory=8192 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=$a2 Port=$N2_PORT CPUs=8 RealMemory=8192 State=UNKNOWN
NodeName=n3 NodeHostname=n3 NodeAddr=$a3 Port=$N3_PORT CPUs=8 RealMemory=8192 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=three Nodes=n[1-3] MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

slurmdbd_conf() {
  cat <<EOF
# Written by slurm/cluster.sh; private to $ROOT.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$ROOT/run/slurmdbd.pid
LogFile=$ROOT/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
}

# oci.conf: Slurm's own containers (`srun --container=BUNDLE`) run through runc, whose state lives
# under $ROOT/runc (a private root: containers of this cluster only). The ids are unique per node,
# job, step and task; Slurm needs Query, Kill and Delete besides Run. `runc kill -a` signals every
# process of a container; `delete --force` removes one that is left. slurmstepd reads the file at
# each step: no daemon restart.
oci_conf() {
  local runc="runc --root=$ROOT/runc" id="%n.%u.%j.%s.%t"
  cat <<EOF
# Written by slurm/cluster.sh; private to $ROOT. Regenerated on every 'up'.
RunTimeQuery="$runc state $id"
RunTimeRun="$runc run $id -b %b"
RunTimeKill="$runc kill -a $id SIGTERM"
RunTimeDelete="$runc delete --force $id"
EOF
}

# install_file SRC DEST MODE: replace DEST by SRC; returns 0 if the content changed.
install_file() {
  local src=$1 dest=$2 mode=$3
  chmod "$mode" "$src"
  if [ -f "$dest" ] && cmp -s "$src" "$dest"; then rm -f "$src"; return 1; fi
  mv "$src" "$dest"
  return 0
}

hosts_add() {
  grep -qxF "$HOSTS_BEGIN" /etc/hosts && return 0
  printf '%s\n127.0.77.1 n1\n127.0.77.2 n2\n127.0.77.3 n3\n%s\n' "$HOSTS_BEGIN" "$HOSTS_END" >> /etc/hosts
}

hosts_remove() {
  grep -qxF "$HOSTS_BEGIN" /etc/hosts || return 0
  # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file.
  local kept
  kept=$(awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts
}


# ------------------------------------------------------------------------------ apart mode's network

# The bridge, and per node a network namespace whose eth0 is one end of a veth on the bridge.
net_fail() { log "error: $* (the apart mode cannot run on this machine; 'up --together' runs without it)"; exit 5; }

net_up() {
  command -v ip >/dev/null 2>&1 || { log "error: --apart needs ip (Debian: apt-get install iproute2)"; exit 4; }
  local node ns veth clash other
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    # Another route to the same subnet would take the nodes' traffic: refuse rather than guess.
    clash=$(ip -4 route show to match "$NET.1" 2>/dev/null | grep -v '^default' | grep -v "dev $BRIDGE" || true)
    [ -z "$clash" ] || die "subnet $NET.0/24 is taken here ($clash); set DDPJOB_SLURM_SUBNET=A.B.C to another private /24"
    ip link add "$BRIDGE" type bridge || net_fail "cannot create bridge $BRIDGE"
  fi
  ip -4 addr show dev "$BRIDGE" | grep -qF " $CTL_ADDR/24 " || ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for node in $NODES; do
    ns=$(netns_of "$node"); veth=$(veth_of "$node")
    [ -e "/run/netns/$ns" ] || ip netns add "$ns" || net_fail "cannot create network namespace $ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name "p$veth" netns "$ns" || net_fail "cannot create veth $veth"
      ip -n "$ns" link set "p$veth" name eth0
    fi
    ip -n "$ns" -4 addr show dev eth0 | grep -qF " $(node_addr "$node")/24 " \
      || ip -n "$ns" addr add "$(node_addr "$node")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    # The node's own name resolution: the nodes by their bridge addresses, its own name included, and
    # their IPv4-mapped IPv6 addresses under names of their own (so that the nodes still resolve to
    # IPv4 alone): torch's rendezvous store (listening on both) looks its clients up in that form and
    # warns "err=-3" on every connection it cannot name.
    { printf '127.0.0.1 localhost\n%s slurm-controller\n' "$CTL_ADDR"
      for other in $NODES; do printf '%s %s\n::ffff:%s %s-v4mapped\n' "$(node_addr "$other")" "$other" "$(node_addr "$other")" "$other"; done
    } > "$ROOT/etc/hosts-$node"
    chmod 0644 "$ROOT/etc/hosts-$node"
  done
}

net_down() {
  local node
  for node in $NODES; do
    ip link del "$(veth_of "$node")" 2>/dev/null || true
    [ -e "/run/netns/$(netns_of "$node")" ] && { ip netns del "$(netns_of "$node")" 2>/dev/null || true; }
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

cmd_link() {
  local node=${1:-} how=${2:-}
  [[ " $NODES " == *" $node "* ]] && { [ "$how" = down ] || [ "$how" = up ]; } \
    || { log "error: usage: link NODE down|up (NODE: ${NODES// /, })"; exit 2; }
  [ "$(cat "$ROOT/etc/mode" 2>/dev/null)" = apart ] || { log "error: link needs the apart mode (up --apart)"; exit 2; }
  ip link set "$(veth_of "$node")" "$how" || die "cannot set $(veth_of "$node") $how"
  # Back up: slurmd registers again at once on SIGHUP. Else Slurm, which may have declared the node down
  # meanwhile (SlurmdTimeout), takes it back only at a later ping, a minute on.
  if [ "$how" = up ] && pid_alive "$ROOT/run/slurmd-$node.pid" slurmd; then
    kill -HUP "$(read_pid "$ROOT/run/slurmd-$node.pid")" 2>/dev/null || true
  fi
  log "link of $node ($(node_addr "$node")) is $how"
}

# ------------------------------------------------------------------------------------------- daemons

STARTED=0  # set to 1 when this run started or restarted any Slurm daemon
COLD=0     # set to 1 when no controller was running as `up` began (first start, or after a crash)

start_munge() {
  pid_alive "$ROOT/munge-run/munged.pid" munged && return 0
  mkdir -p "$ROOT/munge" "$ROOT/munge-run"
  chown munge:munge "$ROOT/munge" "$ROOT/munge-run"
  chmod 0700 "$ROOT/munge"   # key directory: private
  chmod 0755 "$ROOT/munge-run"  # socket directory: munged insists that everyone can traverse it
  if [ ! -s "$ROOT/munge/munge.key" ]; then
    dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1024 count=1 status=none
    chown munge:munge "$ROOT/munge/munge.key"
    chmod 0400 "$ROOT/munge/munge.key"
  fi
  rm -f "$ROOT/munge-run/munged.pid"
  runuser -u munge -- munged --force --socket="$MUNGE_SOCK" --key-file="$ROOT/munge/munge.key" \
    --pid-file="$ROOT/munge-run/munged.pid" --log-file="$ROOT/munge-run/munged.log" \
    --seed-file="$ROOT/munge/munged.seed" </dev/null >/dev/null 2>&1 9>&- \
    || die "munged failed to start; read $ROOT/munge-run/munged.log"
  wait_for 20 munged "$ROOT/munge-run/munged.log" sh -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'"
  STARTED=1
}

db() { mariadb --socket="$ROOT/db/run/mysqld.sock" -u root "$@"; }

start_mariadb() {
  pid_alive "$ROOT/db/run/mariadbd.pid" mariadbd && return 0
  mkdir -p "$ROOT/db/data" "$ROOT/db/run"
  chown -R mysql:mysql "$ROOT/db"
  if [ ! -d "$ROOT/db/data/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$ROOT/db/data" --auth-root-authentication-method=socket \
      >"$ROOT/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; read $ROOT/log/mariadb-install.log"
  fi
  rm -f "$ROOT/db/run/mariadbd.pid"
  # Started as root, runs as mysql; its error log must be in a directory mysql can write (db/run).
  setsid mariadbd --user=mysql --datadir="$ROOT/db/data" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --socket="$ROOT/db/run/mysqld.sock" --pid-file="$ROOT/db/run/mariadbd.pid" \
    --log-error="$ROOT/db/run/error.log" --skip-name-resolve </dev/null >/dev/null 2>&1 9>&- &
  local pid=$! _
  for _ in $(seq 1 300); do
    db -e "SELECT 1" >/dev/null 2>&1 && break
    proc_alive "$pid" mariadbd || die "mariadbd exited at start (port $DB_PORT taken?); read $ROOT/db/run/error.log"
    sleep 0.2
  done
  db -e "SELECT 1" >/dev/null 2>&1 || die "mariadbd did not answer within 60s; read $ROOT/db/run/error.log"
}

# The database user slurmdbd logs in with, with our password: also when mariadbd was already
# running, or its data came from another run whose user had another password.
db_user() {
  db -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    -- A database left by another run may hold the user with another password: set ours.
    ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    FLUSH PRIVILEGES;" || die "could not create the slurm database user; read $ROOT/db/run/error.log"
}

start_slurmdbd() {
  local changed=0
  slurmdbd_conf > "$ROOT/etc/slurmdbd.conf.tmp"
  install_file "$ROOT/etc/slurmdbd.conf.tmp" "$ROOT/etc/slurmdbd.conf" 0600 && changed=1
  if pid_alive "$ROOT/run/slurmdbd.pid" slurmdbd; then
    [ "$changed" = 0 ] && return 0
    log "slurmdbd.conf changed: restarting slurmdbd"
    stop_pid "$ROOT/run/slurmdbd.pid" slurmdbd
  fi
  rm -f "$ROOT/run/slurmdbd.pid"
  SLURM_CONF=$CONF slurmdbd </dev/null >/dev/null 2>&1 9>&- || die "slurmdbd failed to start; read $ROOT/log/slurmdbd.log"
  wait_for 30 slurmdbd "$ROOT/log/slurmdbd.log" sacctmgr -n -P list cluster
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster $CLUSTER failed; read $ROOT/log/slurmdbd.log"
  fi
}

# "accounting on" only once sacct answers: slurmdbd may run while it cannot reach its database.
check_accounting() {
  local err=$ROOT/log/sacct-check.err attempt
  for attempt in 1 2; do
    for _ in $(seq 1 15); do
      if timeout 10 sacct -n -X -S now-1hours -o JobID >/dev/null 2>"$err"; then return 0; fi
      sleep 1
    done
    [ "$attempt" = 1 ] || break
    # A slurmdbd that lost its database (user or password changed under it) does not log in again.
    log "sacct gets no answer; restarting slurmdbd"
    stop_pid "$ROOT/run/slurmdbd.pid" slurmdbd
    start_slurmdbd
  done
  die "accounting is configured but sacct gets no answer ($(tail -n 1 "$err" 2>/dev/null)); read $ROOT/log/slurmdbd.log and $ROOT/db/run/error.log; 'up --no-accounting' runs without it, 'down --purge' then 'up' starts from a fresh database"
}

start_slurmctld() {
  pid_alive "$ROOT/run/slurmctld.pid" slurmctld && return 0
  rm -f "$ROOT/run/slurmctld.pid"
  # -i: go on if a state file is unreadable (a fresh StateSaveLocation has none).
  slurmctld -i </dev/null >/dev/null 2>&1 9>&- || die "slurmctld failed to start; read $ROOT/log/slurmctld.log"
  wait_for 30 slurmctld "$ROOT/log/slurmctld.log" sh -c "scontrol ping | grep -q 'is UP'"
  STARTED=1
}

start_slurmd() {
  local node=$1
  pid_alive "$ROOT/run/slurmd-$node.pid" slurmd && return 0
  rm -f "$ROOT/run/slurmd-$node.pid"
  mkdir -p "$ROOT/spool/slurmd-$node"
  if [ "$MODE" = apart ]; then
    # Its own network namespace (nsenter, not `ip netns exec`, which remounts /sys), hostname and
    # /etc/hosts (a private mount namespace): a separate machine as far as its jobs can tell.
    nsenter --net="/run/netns/$(netns_of "$node")" unshare --uts --mount --propagation private \
      sh -c "mount --bind '$ROOT/etc/hosts-$node' /etc/hosts && hostname $node && exec slurmd -N $node" \
      </dev/null >/dev/null 2>&1 9>&- || die "slurmd $node failed to start; read $ROOT/log/slurmd-$node.log"
  else
    # Its own UTS namespace: jobs on this node see hostname $node, as on a separate machine.
    unshare --uts sh -c "hostname $node && exec slurmd -N $node" </dev/null >/dev/null 2>&1 9>&- \
      || die "slurmd $node failed to start; read $ROOT/log/slurmd-$node.log"
  fi
  wait_for 20 "slurmd $node" "$ROOT/log/slurmd-$node.log" pid_alive "$ROOT/run/slurmd-$node.pid" slurmd
  STARTED=1
}

stop_slurm_daemons() {
  local node
  for node in $NODES; do stop_pid "$ROOT/run/slurmd-$node.pid" slurmd; done
  stop_pid "$ROOT/run/slurmctld.pid" slurmctld
}

# Node states as "n1 idle" lines. A trailing * (not responding), ~ or # means not usable yet.
node_states() { sinfo -h -N -o '%N %t' 2>/dev/null | sort -u; }

wait_nodes_usable() {
  local i states node state resumed="" reset=""
  for i in $(seq 1 200); do
    states=$(node_states)
    local ok=1
    for node in $NODES; do
      state=$(awk -v n="$node" '$1==n{print $2; exit}' <<<"$states")
      case "$state" in
        idle|mix|alloc|comp) ;;
        drain|drng|down|fail|failg|inval)
          ok=0
          # ReturnToService=2 does not clear a DRAIN: resume each such node once.
          if [[ " $resumed " != *" $node "* ]]; then
            log "node $node is $state: scontrol update state=resume"
            scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
            resumed="$resumed $node"
          fi ;;
        *) ok=0 ;;
      esac
    done
    [ "$ok" = 1 ] && [[ "$states" != *" comp"* || "$COLD" != 1 ]] && return 0
    if [ "$COLD" = 1 ] && [ "$i" -ge 25 ]; then
      # Cold start (no controller was running): a job that ran when the daemons were killed (a
      # killed session, a reboot) is recovered as "completing" and can hold its node for minutes,
      # so the smoke test would queue behind it. Nothing of this life runs there: reset the node.
      for node in $(awk '$2 ~ /^comp/ {print $1}' <<<"$states"); do
        if [[ " $reset " != *" $node "* ]]; then
          log "node $node holds a job left from before the restart: resetting it (down, resume)"
          scontrol update nodename="$node" state=down reason="ddpjob: stale job from a previous run" >/dev/null 2>&1 || true
          scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
          reset="$reset $node"
        fi
      done
    fi
    sleep 0.2
  done
  die "nodes are not usable after 40s: $(tr '\n' ' ' <<<"$states")(sinfo -R: $(sinfo -h -R 2>/dev/null | tr '\n' ' ')); read $ROOT/log/slurmctld.log and $ROOT/log/slurmd-n*.log"
}

smoke_test() {
  local hosts="" _
  for _ in 1 2 3 4 5; do
    hosts=$(timeout 60 srun -p three -N3 -n3 -t 1 --job-name=cluster-smoke /bin/hostname 2>&1 | sort | tr '\n' ' ') || true
    [ "$hosts" = "$NODES " ] && return 0
    sleep 1
    scontrol update nodename="${NODES// /,}" state=resume >/dev/null 2>&1 || true
  done
  die "smoke test srun -p three -N3 -n3 hostname: expected '$NODES', got: $hosts; read $ROOT/log/"
}

# ---------------------------------------------------------------------------------------- commands

MODE=together
cmd_up() {
  local accounting=1 arg
  MODE=$(cat "$ROOT/etc/mode" 2>/dev/null || echo together)
  for arg in "$@"; do
    case "$arg" in
      --no-accounting) accounting=0 ;;
      --apart) MODE=apart ;;
      --together) MODE=together ;;
      *) log "error: unknown option $arg (usage: up [--no-accounting] [--apart|--together])"; exit 2 ;;
    esac
  done
  [ "$(id -u)" = 0 ] || { log "error: up needs root (packages, /etc/hosts, slurmd as root)"; exit 4; }
  COLD=0
  pid_alive "$ROOT/run/slurmctld.pid" slurmctld || COLD=1
  install_packages
  mkdir -p "$ROOT"/{etc,state,run,log}
  for arg in $NODES; do mkdir -p "$ROOT/spool/slurmd-$arg"; done
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' > "$ROOT/etc/cgroup.conf"
  # munged and mariadbd drop root: every parent directory of $ROOT must let them through.
  local user
  for user in munge $([ "$accounting" = 1 ] && echo mysql); do
    runuser -u "$user" -- test -x "$ROOT" \
      || die "user $user cannot reach $ROOT (a parent directory is not world-executable, e.g. a 0700 temp dir); set DDPJOB_SLURM_ROOT elsewhere"
  done

  # A changed slurm.conf (accounting switched, or a newer version of this script) restarts
  # slurmctld and the slurmds; jobs' steps survive a slurmd restart. munge and MariaDB stay up.
  slurm_conf "$accounting" "$MODE" > "$CONF.tmp"
  if install_file "$CONF.tmp" "$CONF" 0644 && pid_alive "$ROOT/run/slurmctld.pid" slurmctld; then
    log "slurm.conf changed (accounting $([ "$accounting" = 1 ] && echo on || echo off), nodes $MODE): restarting slurmctld and slurmd"
    stop_slurm_daemons
  fi
  echo "$accounting" > "$ROOT/etc/accounting"
  mkdir -p "$ROOT/runc"
  oci_conf > "$ROOT/etc/oci.conf.tmp"
  install_file "$ROOT/etc/oci.conf.tmp" "$ROOT/etc/oci.conf" 0644 || true
  echo "$MODE" > "$ROOT/etc/mode"
  if [ "$MODE" = apart ]; then
    net_up
    hosts_remove  # the nodes have their own /etc/hosts; the machine's keeps no stale names
  else
    net_down
    hosts_add
  fi
  start_munge
  if [ "$accounting" = 1 ]; then
    start_mariadb
    db_user
    start_slurmdbd
  fi
  start_slurmctld
  for arg in $NODES; do start_slurmd "$arg"; done
  wait_nodes_usable
  if [ "$STARTED" = 1 ] || [ -z "$(node_states | awk '$2!="idle"')" ]; then
    smoke_test
  else
    # Already up and busy with jobs: the daemons and node states above are the health check
    # (a smoke srun could wait behind the running jobs).
    log "already up; nodes busy, smoke srun skipped"
  fi
  if [ "$accounting" = 1 ]; then check_accounting; fi
  log "up: nodes $NODES, accounting $([ "$accounting" = 1 ] && echo on || echo off), $([ "$MODE" = apart ] && echo "apart: $(node_addrs), controller $CTL_ADDR on bridge $BRIDGE" || echo "together on loopback"); use: eval \"\$($0 env)\""
}

cmd_down() {
  local purge=0 arg
  for arg in "$@"; do
    case "$arg" in
      --purge) purge=1 ;;
      *) log "error: unknown option $arg (usage: down [--purge])"; exit 2 ;;
    esac
  done
  stop_slurm_daemons
  stop_pid "$ROOT/run/slurmdbd.pid" slurmdbd
  stop_pid "$ROOT/db/run/mariadbd.pid" mariadbd
  stop_pid "$ROOT/munge-run/munged.pid" munged
  net_down
  hosts_remove
  if [ "$purge" = 1 ]; then
    case "$ROOT" in /|'') die "refusing to delete '$ROOT'" ;; esac
    rm -rf "$ROOT"
    log "down: stopped and purged $ROOT"
  else
    log "down: stopped (state kept in $ROOT; 'down --purge' deletes it)"
  fi
}

cmd_status() {
  local running=0 expected=0 f name accounting
  accounting=$(cat "$ROOT/etc/accounting" 2>/dev/null || echo 1)
  for f in munge-run/munged.pid:munged db/run/mariadbd.pid:mariadbd run/slurmdbd.pid:slurmdbd \
           run/slurmctld.pid:slurmctld run/slurmd-n1.pid:slurmd run/slurmd-n2.pid:slurmd run/slurmd-n3.pid:slurmd; do
    name=${f#*:}
    if [ "$accounting" = 1 ] || { [ "$name" != mariadbd ] && [ "$name" != slurmdbd ]; }; then
      expected=$((expected + 1))
    fi
    if pid_alive "$ROOT/${f%%:*}" "$name"; then
      echo "$name running (pid $(read_pid "$ROOT/${f%%:*}"), $ROOT/${f%%:*})"
      running=$((running + 1))
    else
      echo "$name not running"
    fi
  done
  echo "accounting: $([ "$accounting" = 1 ] && echo on || echo off)"
  echo "nodes: $(cat "$ROOT/etc/mode" 2>/dev/null || echo together)$([ "$(cat "$ROOT/etc/mode" 2>/dev/null)" = apart ] && echo " ($(node_addrs), controller $CTL_ADDR on $BRIDGE)")"
  echo "root: $ROOT"
  echo "SLURM_CONF=$CONF"
  if [ "$running" = 0 ]; then echo "cluster: down"; return 3; fi
  sinfo -N 2>/dev/null || true
  # The Slurm daemons must all run, and with accounting, slurmdbd and MariaDB too.
  local core=1 d
  for d in "run/slurmctld.pid:slurmctld" "run/slurmd-n1.pid:slurmd" "run/slurmd-n2.pid:slurmd" "run/slurmd-n3.pid:slurmd" \
           "munge-run/munged.pid:munged"; do
    pid_alive "$ROOT/${d%%:*}" "${d#*:}" || core=0
  done
  if [ "$accounting" = 1 ]; then
    pid_alive "$ROOT/run/slurmdbd.pid" slurmdbd || core=0
    pid_alive "$ROOT/db/run/mariadbd.pid" mariadbd || core=0
  fi
  if [ "$core" = 1 ]; then echo "cluster: up"; return 0; fi
  echo "cluster: partly up (run '$0 up' to repair)"
  return 1
}

# One up/down at a time per root (two test sessions may share a cluster). The daemons do not
# inherit the lock (9>&- on each launch).
lock() {
  [ "$(id -u)" = 0 ] || return 0
  mkdir -p "$ROOT"
  exec 9>"$ROOT/.lock"
  flock -w 900 9 || die "another slurm/cluster.sh held $ROOT/.lock for 15 minutes"
}

case "${1:-}" in
  up) shift; lock; cmd_up "$@" ;;
  down) shift; if [ -d "$ROOT" ]; then lock; fi; cmd_down "$@" ;;
  status) shift; [ $# = 0 ] || { log "error: status takes no options"; exit 2; }; cmd_status ;;
  env) printf 'export SLURM_CONF=%q\n' "$CONF" ;;
  link) shift; [ "$(id -u)" = 0 ] || { log "error: link needs root"; exit 4; }; cmd_link "$@" ;;
  -h|--help|help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "usage: $0 up [--no-accounting] [--apart|--together] | down [--purge] | status | link NODE down|up | env" >&2; exit 2 ;;
esac
