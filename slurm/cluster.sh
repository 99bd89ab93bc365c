#!/usr/bin/env bash
# A private 2-node Slurm cluster on this machine, for ddpjob's tests and for trying the Slurm target.
#
#   slurm/cluster.sh up [--no-accounting]   install packages if missing, start (idempotent)
#   slurm/cluster.sh down [--purge]         stop what this script started (--purge: delete its state)
#   slurm/cluster.sh status                 which daemons run
#   eval "$(slurm/cluster.sh env)"          point sbatch/squeue/sacct at this cluster
#
# Everything lives under $DDPJOB_SLURM_ROOT (default ${TMPDIR:-/tmp}/ddpjob-slurm) and listens on
# private ports from $SLURM_TEST_PORT (default 16817). Nodes n1 and n2 run as two slurmd on
# 127.0.77.1/127.0.77.2, each in its own UTS namespace so jobs see distinct hostnames; the names
# go into /etc/hosts inside a marked block that `down` removes. Needs root (apt, /etc/hosts).
set -euo pipefail

ROOT=${DDPJOB_SLURM_ROOT:-${TMPDIR:-/tmp}/ddpjob-slurm}
BASE=${SLURM_TEST_PORT:-16817}
CTLD_PORT=$BASE
N1_PORT=$((BASE + 1))
N2_PORT=$((BASE + 2))
DBD_PORT=$((BASE + 100))
DB_PORT=$((BASE + 101))
CLUSTER=ddptest
CONF=$ROOT/etc/slurm.conf
MUNGE_SOCK=$ROOT/munge-run/munge.sock
HOSTS_BEGIN="# BEGIN ddpjob-slurm ($ROOT)"
HOSTS_END="# END ddpjob-slurm ($ROOT)"
DB_PASS=ddpjob-slurm-test
export SLURM_CONF=$CONF

log() { printf 'slurm/cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A pid is ours only if it runs (not a zombie: this VM's init reaps lazily) under the expected name.
pid_alive() {
  local pidfile=$1 name=$2 pid stat
  [ -s "$pidfile" ] || return 1
  pid=$(tr -dc '0-9' < "$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ "$stat" == *"($name)"* ]] || return 1
  local state=${stat##*) }
  state=${state%% *}
  [ "$state" != Z ] && [ "$state" != X ]
}

stop_pid() {
  local pidfile=$1 name=$2 pid i
  pid_alive "$pidfile" "$name" || { rm -f "$pidfile"; return 0; }
  pid=$(tr -dc '0-9' < "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do pid_alive "$pidfile" "$name" || break; sleep 0.1; done
  pid_alive "$pidfile" "$name" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

wait_for() {  # wait_for SECONDS DESCRIPTION LOGFILE COMMAND...
  local secs=$1 what=$2 logfile=$3 i
  shift 3
  for i in $(seq 1 $((secs * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what did not come up within ${secs}s; see $logfile"
}

install_packages() {
  local missing=0 cmd
  for cmd in slurmctld slurmd sbatch munged slurmdbd mariadbd; do
    command -v "$cmd" >/dev/null 2>&1 || missing=1
  done
  [ "$missing" = 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "Slurm packages are missing and installing them needs root"
  log "installing Debian's Slurm, munge and MariaDB packages"
  # Keep apt from starting the system's own daemons: only this script's private ones run.
  local made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd mariadb-server >/dev/null
  [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  return 0
}

write_config() {
  local accounting=$1
  mkdir -p "$ROOT"/{etc,state,run,log,spool/slurmd-n1,spool/slurmd-n2}
  local acct_storage="accounting_storage/none" gather="jobacct_gather/none" acct_lines=""
  if [ "$accounting" = 1 ]; then
    acct_storage="accounting_storage/slurmdbd"
    gather="jobacct_gather/linux"
    acct_lines="AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherFrequency=30"
  fi
  cat > "$CONF.tmp" <<EOF
# Written by slurm/cluster.sh; private to $ROOT.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
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
MinJobAge=600
InactiveLimit=0
JobRequeue=1
AccountingStorageType=$acct_storage
JobAcctGatherType=$gather
JobCompType=jobcomp/none
$acct_lines
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.77.1 Port=$N1_PORT CPUs=4 RealMemory=4096 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.77.2 Port=$N2_PORT CPUs=4 RealMemory=4096 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$CONF.tmp" "$CONF"
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' > "$ROOT/etc/cgroup.conf"
  echo "$accounting" > "$ROOT/etc/accounting"
}

hosts_add() {
  grep -qF "$HOSTS_BEGIN" /etc/hosts && return 0
  printf '%s\n127.0.77.1 n1\n127.0.77.2 n2\n%s\n' "$HOSTS_BEGIN" "$HOSTS_END" >> /etc/hosts
}

hosts_remove() {
  grep -qF "$HOSTS_BEGIN" /etc/hosts || return 0
  # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file.
  local kept
  kept=$(awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts
}

start_munge() {
  pid_alive "$ROOT/munge-run/munged.pid" munged && return 0
  mkdir -p "$ROOT/munge" "$ROOT/munge-run"
  chown munge:munge "$ROOT/munge" "$ROOT/munge-run"
  chmod 0700 "$ROOT/munge"
  chmod 0755 "$ROOT/munge-run"
  if [ ! -s "$ROOT/munge/munge.key" ]; then
    dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1024 count=1 status=none
    chown munge:munge "$ROOT/munge/munge.key"
    chmod 0400 "$ROOT/munge/munge.key"
  fi
  runuser -u munge -- munged --force --socket="$MUNGE_SOCK" --key-file="$ROOT/munge/munge.key" \
    --pid-file="$ROOT/munge-run/munged.pid" --log-file="$ROOT/munge-run/munged.log" \
    --seed-file="$ROOT/munge/munged.seed" </dev/null >/dev/null 2>&1 \
    || die "munged failed to start; see $ROOT/munge-run/munged.log"
  wait_for 20 munged "$ROOT/munge-run/munged.log" sh -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'"
}

start_mariadb() {
  pid_alive "$ROOT/db/run/mariadbd.pid" mariadbd && return 0
  mkdir -p "$ROOT/db/data" "$ROOT/db/run"
  chown -R mysql:mysql "$ROOT/db"
  if [ ! -d "$ROOT/db/data/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$ROOT/db/data" --auth-root-authentication-method=socket \
      >"$ROOT/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $ROOT/log/mariadb-install.log"
  fi
  setsid mariadbd --user=mysql --datadir="$ROOT/db/data" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --socket="$ROOT/db/run/mysqld.sock" --pid-file="$ROOT/db/run/mariadbd.pid" \
    --log-error="$ROOT/db/run/error.log" --skip-name-resolve </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadbd "$ROOT/db/run/error.log" mariadb --socket="$ROOT/db/run/mysqld.sock" -u root -e "SELECT 1"
  mariadb --socket="$ROOT/db/run/mysqld.sock" -u root -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    FLUSH PRIVILEGES;"
}

start_slurmdbd() {
  pid_alive "$ROOT/run/slurmdbd.pid" slurmdbd && return 0
  cat > "$ROOT/etc/slurmdbd.conf" <<EOF
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
  chmod 0600 "$ROOT/etc/slurmdbd.conf"
  slurmdbd </dev/null >/dev/null 2>&1 || die "slurmdbd failed to start; see $ROOT/log/slurmdbd.log"
  wait_for 30 slurmdbd "$ROOT/log/slurmdbd.log" sacctmgr -n -P list cluster
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
}

start_slurmctld() {
  pid_alive "$ROOT/run/slurmctld.pid" slurmctld && return 0
  slurmctld -i </dev/null >/dev/null 2>&1 || die "slurmctld failed to start; see $ROOT/log/slurmctld.log"
  wait_for 30 slurmctld "$ROOT/log/slurmctld.log" sh -c "scontrol ping | grep -q UP"
}

start_slurmd() {
  local node=$1
  pid_alive "$ROOT/run/slurmd-$node.pid" slurmd && return 0
  # Its own UTS namespace: jobs on this node see hostname $node, as on a separate machine.
  unshare --uts sh -c "hostname $node && exec slurmd -N $node" </dev/null >/dev/null 2>&1 \
    || die "slurmd $node failed to start; see $ROOT/log/slurmd-$node.log"
  wait_for 20 "slurmd $node" "$ROOT/log/slurmd-$node.log" test -s "$ROOT/run/slurmd-$node.pid"
}

wait_nodes_idle() {
  local i states
  for i in $(seq 1 150); do
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u)
    if echo "$states" | grep -q '^n1 \(idle\|mix\|alloc\)' && echo "$states" | grep -q '^n2 \(idle\|mix\|alloc\)'; then
      return 0
    fi
    if [ "$i" = 10 ] || [ "$i" = 50 ]; then
      scontrol update nodename=n1,n2 state=resume >/dev/null 2>&1 || true
    fi
    sleep 0.2
  done
  die "nodes are not idle: $(echo "$states" | tr '\n' ' '); see $ROOT/log/"
}

stop_slurm_daemons() {
  stop_pid "$ROOT/run/slurmd-n1.pid" slurmd
  stop_pid "$ROOT/run/slurmd-n2.pid" slurmd
  stop_pid "$ROOT/run/slurmctld.pid" slurmctld
}

cmd_up() {
  local accounting=1
  for arg in "$@"; do
    case "$arg" in
      --no-accounting) accounting=0 ;;
      *) die "unknown option $arg (usage: up [--no-accounting])" ;;
    esac
  done
  install_packages
  mkdir -p "$ROOT/log"
  local previous
  previous=$(cat "$ROOT/etc/accounting" 2>/dev/null || echo none)
  if [ "$previous" != "$accounting" ] && pid_alive "$ROOT/run/slurmctld.pid" slurmctld; then
    log "switching accounting $previous -> $accounting: restarting the Slurm daemons"
    stop_slurm_daemons
  fi
  write_config "$accounting"
  hosts_add
  start_munge
  if [ "$accounting" = 1 ]; then
    start_mariadb
    start_slurmdbd
  fi
  start_slurmctld
  start_slurmd n1
  start_slurmd n2
  wait_nodes_idle
  # Smoke test; a node that just re-registered may need a moment, so try a few times.
  local hosts="" try
  for try in 1 2 3 4 5; do
    hosts=$(srun -N2 -n2 -t 1 /bin/hostname 2>&1 | sort | tr '\n' ' ') || true
    [ "$hosts" = "n1 n2 " ] && break
    sleep 1
    scontrol update nodename=n1,n2 state=resume >/dev/null 2>&1 || true
  done
  [ "$hosts" = "n1 n2 " ] || die "smoke test srun -N2 hostname: expected n1 n2, got: $hosts (see $ROOT/log/)"
  log "up: 2 nodes (n1, n2), accounting $([ "$accounting" = 1 ] && echo on || echo off); eval \"\$($0 env)\""
}

cmd_down() {
  local purge=0
  for arg in "$@"; do
    case "$arg" in
      --purge) purge=1 ;;
      *) die "unknown option $arg (usage: down [--purge])" ;;
    esac
  done
  stop_slurm_daemons
  stop_pid "$ROOT/run/slurmdbd.pid" slurmdbd
  stop_pid "$ROOT/db/run/mariadbd.pid" mariadbd
  stop_pid "$ROOT/munge-run/munged.pid" munged
  hosts_remove
  if [ "$purge" = 1 ]; then
    rm -rf "$ROOT"
    log "down: stopped and purged $ROOT"
  else
    log "down: stopped (state kept in $ROOT; --purge deletes it)"
  fi
}

cmd_status() {
  local any=0 f name
  for f in munge-run/munged.pid:munged db/run/mariadbd.pid:mariadbd run/slurmdbd.pid:slurmdbd \
           run/slurmctld.pid:slurmctld run/slurmd-n1.pid:slurmd run/slurmd-n2.pid:slurmd; do
    name=${f#*:}
    if pid_alive "$ROOT/${f%%:*}" "$name"; then
      echo "$name running (pid $(tr -dc '0-9' < "$ROOT/${f%%:*}"), $ROOT/${f%%:*})"
      any=1
    fi
  done
  [ "$any" = 1 ] || { echo "not running ($ROOT)"; return 3; }
  echo "accounting: $([ "$(cat "$ROOT/etc/accounting" 2>/dev/null)" = 1 ] && echo on || echo off)"
  sinfo -N 2>/dev/null || true
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 up [--no-accounting] | down [--purge] | status | env" >&2; exit 2 ;;
esac
