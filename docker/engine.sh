#!/usr/bin/env bash
# A real container engine (podman) and the training image on this machine, for ddpjob's tests and
# for trying `local.container: podman`.
#
#   docker/engine.sh up [--base IMAGE] [--torch REQUIREMENT]   install, configure, build (idempotent)
#   docker/engine.sh status                                    exit 0 ready, 3 not ready (says why)
#   eval "$(docker/engine.sh env)"                             DDPJOB_TEST_IMAGE=<the image>, and
#                                                              build.sh's defaults for this machine
#   docker/engine.sh purge                                     remove the images, cache and config it made
#
# up, step by step (each step is skipped when its result is already there):
# 1. Debian's podman, runc, catatonit (for --init) and debootstrap, installed with apt-get if missing;
#    with them the CNI plugins and iptables of podman's bridge networks (local.network: bridge).
# 2. A Debian base image, localhost/ddpjob-base:<codename>: --base IMAGE if given; else
#    debian:<codename>-slim if a registry answers; else built with debootstrap from the first Debian
#    mirror this machine's apt sources name (about 90 s), cached as a tarball.
# 3. A container must run. Where podman's defaults fail (crun on a hybrid cgroup tree, rlimits that
#    cannot be raised), the settings of this kind of machine go into
#    /etc/containers/containers.conf.d/50-ddpjob.conf: runc, cgroupfs, default_ulimits = [].
# 4. The image ($DDPJOB_TEST_IMAGE, default localhost/ddpjob-train:cpu) built by docker/build.sh
#    on that base with this machine's pip configuration (--host-pip). Its torch: --torch, else
#    $DDPJOB_IMAGE_TORCH, else the newest CPU wheel of torch for Python 3.11 in pip's find-links
#    (here torch 2.13.0+cpu), else the CPU wheels of the pinned torch from download.pytorch.org.
#    podman's layer cache keeps torch's layer until pyproject.toml or the torch choice changes.
# Everything else lives under $DDPJOB_ENGINE_CACHE (default /var/cache/ddpjob-engine): the base
# tarball, logs (debootstrap.log, apt.log, build.log), a lock (one `up` at a time).
#
# Exit codes: 0 ready, 1 unexpected failure (the message names the log), 2 bad usage, 3 not ready
# (status), 4 podman cannot be installed (not root, no apt-get, apt failed), 5 podman is installed
# but cannot run a container here, 6 no base image (no registry and debootstrap failed),
# 7 the image build failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${DDPJOB_ENGINE_CACHE:-/var/cache/ddpjob-engine}
IMAGE=${DDPJOB_TEST_IMAGE:-localhost/ddpjob-train:cpu}
CODENAME=bookworm  # the Python of the base (3.11) must match the torch wheel the image takes
BASE=localhost/ddpjob-base:$CODENAME
CONF_DROPIN=/etc/containers/containers.conf.d/50-ddpjob.conf
PKGS=(podman runc catatonit debootstrap containernetworking-plugins iptables)

log() { printf 'docker/engine.sh: %s\n' "$*" >&2; }
fail() { local code=$1; shift; log "error: $*"; exit "$code"; }
now() { date +%s; }

missing_cmds() {
  local c out=""
  for c in podman runc debootstrap; do
    PATH=$PATH:/usr/sbin:/sbin command -v "$c" >/dev/null 2>&1 || out="$out $c"
  done
  [ -x /usr/bin/catatonit ] || [ -x /usr/libexec/podman/catatonit ] || out="$out catatonit"
  # Bridge networks: podman 4 on Debian 12 uses the CNI plugins (netavark where it is installed);
  # their firewall plugin runs iptables.
  [ -x /usr/lib/cni/bridge ] || [ -x /usr/lib/podman/netavark ] || out="$out containernetworking-plugins"
  PATH=$PATH:/usr/sbin:/sbin command -v iptables >/dev/null 2>&1 || out="$out iptables"
  printf '%s' "$out"
}

install_packages() {
  local missing aptlog=$CACHE/apt.log
  missing=$(missing_cmds)
  [ -z "$missing" ] && return 0
  command -v apt-get >/dev/null 2>&1 || fail 4 "missing$missing and there is no apt-get (install podman yourself)"
  log "installing Debian's ${PKGS[*]} (missing:$missing)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${PKGS[@]}" >"$aptlog" 2>&1; then
    if ! { apt-get update -q >>"$aptlog" 2>&1 \
           && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${PKGS[@]}" >>"$aptlog" 2>&1; }; then
      tail -n 15 "$aptlog" >&2
      fail 4 "apt-get could not install ${PKGS[*]}; read $aptlog"
    fi
  fi
  missing=$(missing_cmds)
  [ -z "$missing" ] || fail 4 "still missing after apt-get:$missing; read $aptlog"
}

# The first URI of this machine's apt sources that serves $CODENAME (one-line and deb822 formats).
debian_mirror() {
  local f uri="" suites="" line
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    while read -r line; do
      # shellcheck disable=SC2086
      set -- $line
      if [ "${1:-}" = deb ] && [ "${3:-}" = "$CODENAME" ]; then echo "$2"; return 0; fi
    done < <(sed -e 's/\[[^]]*\]//' "$f")
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=""; suites=""
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in
        URIs:*) uri=$(echo "${line#URIs:}" | awk '{print $1}') ;;
        Suites:*) suites=" ${line#Suites:} " ;;
        "") if [ -n "$uri" ] && [[ "$suites" == *" $CODENAME "* ]]; then echo "$uri"; return 0; fi
            uri=""; suites="" ;;
      esac
    done < "$f"
    if [ -n "$uri" ] && [[ "$suites" == *" $CODENAME "* ]]; then echo "$uri"; return 0; fi
  done
  echo http://deb.debian.org/debian
}

make_base() {
  local given=$1 tarball=$CACHE/base-$CODENAME.tar rootfs mirror t
  if [ -n "$given" ]; then
    podman image exists "$given" || podman pull -q "$given" >/dev/null || fail 6 "cannot pull --base $given"
    podman tag "$given" "$BASE"
    return 0
  fi
  podman image exists "$BASE" && return 0
  if [ ! -s "$tarball" ]; then
    if timeout 60 podman pull -q "docker.io/library/debian:$CODENAME-slim" >/dev/null 2>>"$CACHE/pull.log"; then
      podman tag "docker.io/library/debian:$CODENAME-slim" "$BASE"
      log "base image: debian:$CODENAME-slim from the registry"
      return 0
    fi
    mirror=$(debian_mirror)
    log "no image registry answers; making the base with debootstrap from $mirror (about 90 s; log: $CACHE/debootstrap.log)"
    t=$(now)
    rootfs=$CACHE/rootfs.tmp
    rm -rf "$rootfs"
    if ! debootstrap --variant=minbase "$CODENAME" "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1; then
      tail -n 15 "$CACHE/debootstrap.log" >&2
      rm -rf "$rootfs"
      fail 6 "debootstrap failed; read $CACHE/debootstrap.log"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
    log "debootstrap took $(( $(now) - t ))s (cached: $tarball)"
  fi
  podman import -q "$tarball" "$BASE" >/dev/null || fail 6 "podman import $tarball failed"
}

probe() { podman run --rm --network=host "$BASE" true >"$CACHE/probe.log" 2>&1; }

configure() {
  probe && return 0
  log "podman's defaults cannot run a container here ($(tail -n 1 "$CACHE/probe.log")); writing $CONF_DROPIN"
  mkdir -p "$(dirname "$CONF_DROPIN")"
  cat > "$CONF_DROPIN" <<'EOF'
# Written by ddpjob's docker/engine.sh: podman's settings for machines where its defaults fail
# (crun cannot handle a hybrid cgroup tree; containers may not raise RLIMIT_NOFILE/NPROC).
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
  probe || { cat "$CACHE/probe.log" >&2; fail 5 "podman cannot run a container here even with $CONF_DROPIN"; }
}

# The torch requirement of the image (see the header); prints "REQUIREMENT<TAB>INDEX".
torch_choice() {
  local given=$1 dirs d wheel="" v
  if [ -n "$given" ]; then printf '%s\t\n' "$given"; return 0; fi
  dirs=$("${PIP:-pip}" config list 2>/dev/null | sed -n "s/^.*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sed 's#^file://##' | sort -u)
  for d in $dirs; do
    for v in "$d"/torch-*+cpu-cp311-cp311-*.whl; do [ -f "$v" ] && wheel="$wheel $v"; done
  done
  if [ -n "$wheel" ]; then
    v=$(printf '%s\n' $wheel | sed 's#.*/torch-\([^+]*\)+cpu-.*#\1#' | sort -V | tail -n 1)
    printf 'torch==%s\t\n' "$v"
  else
    printf '\tauto\n'
  fi
}

build_image() {
  local torch=$1 choice req index old new t req_shown=""
  choice=$(torch_choice "$torch")
  req=${choice%%$'\t'*}
  index=${choice#*$'\t'}
  old=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  [ -n "$req" ] || req_shown="the CPU wheels of the pinned torch (download.pytorch.org)"
  log "building $IMAGE on $BASE with torch: ${req_shown:-$req} (log: $CACHE/build.log)"
  t=$(now)
  if ! new=$("$HERE/build.sh" --engine podman --base "$BASE" --tag "$IMAGE" --host-pip \
               --torch "$req" --torch-index "$index" 2>"$CACHE/build.log"); then
    tail -n 20 "$CACHE/build.log" >&2
    fail 7 "the image build failed; read $CACHE/build.log"
  fi
  log "image $IMAGE ${new#sha256:} ready in $(( $(now) - t ))s"
  # The image it replaced, unless a container still uses it (podman refuses then).
  if [ -n "$old" ] && [ "sha256:$old" != "$new" ] && [ "$old" != "$new" ]; then
    podman rmi "$old" >/dev/null 2>&1 || true
  fi
}

cmd_up() {
  local base="" torch=${DDPJOB_IMAGE_TORCH:-} t0
  while [ $# -gt 0 ]; do
    case "$1" in
      --base) [ $# -ge 2 ] || fail 2 "--base needs an image"; base=$2; shift 2 ;;
      --torch) [ $# -ge 2 ] || fail 2 "--torch needs a requirement"; torch=$2; shift 2 ;;
      *) fail 2 "unknown option '$1' (up [--base IMAGE] [--torch REQUIREMENT])" ;;
    esac
  done
  t0=$(now)
  install_packages
  make_base "$base"
  configure
  build_image "$torch"
  log "up: ready in $(( $(now) - t0 ))s: podman $(podman version --format '{{.Client.Version}}'), image $IMAGE"
}

cmd_status() {
  local ok=0
  if [ -n "$(missing_cmds)" ]; then echo "podman: not installed (missing:$(missing_cmds))"; ok=3
  elif ! podman image exists "$IMAGE"; then echo "image $IMAGE: missing (docker/engine.sh up builds it)"; ok=3
  elif ! podman run --rm --network=host "$IMAGE" true >/dev/null 2>&1; then echo "podman cannot run $IMAGE here"; ok=3
  else echo "podman $(podman version --format '{{.Client.Version}}'): runs containers; image $IMAGE"; fi
  echo "cache: $CACHE"
  return "$ok"
}

cmd_purge() {
  if command -v podman >/dev/null 2>&1; then
    podman rmi -f "$IMAGE" "$BASE" >/dev/null 2>&1 || true
  fi
  if [ -f "$CONF_DROPIN" ] && grep -q "docker/engine.sh" "$CONF_DROPIN"; then rm -f "$CONF_DROPIN"; fi
  case "$CACHE" in /|'') fail 1 "refusing to delete '$CACHE'" ;; esac
  rm -rf "$CACHE"
  log "purged $IMAGE, $BASE, $CACHE (Debian's packages stay installed)"
}

# One up at a time: the lock is held by flock itself (-o: the script and the conmon/podman
# processes it starts do not inherit the lock's descriptor).
locked() {
  [ "$(id -u)" = 0 ] || fail 4 "up needs root (apt-get, /etc/containers, rootful podman)"
  mkdir -p "$CACHE"
  chmod 700 "$CACHE"
  local rc=0
  flock -o -w 900 -E 75 "$CACHE/.lock" bash "${BASH_SOURCE[0]}" "$@" || rc=$?
  [ "$rc" != 75 ] || fail 1 "another docker/engine.sh held $CACHE/.lock for 15 minutes"
  exit "$rc"
}

case "${1:-}" in
  up) shift; locked __up "$@" ;;
  __up) shift; cmd_up "$@" ;;
  status) shift; [ $# = 0 ] || fail 2 "status takes no options"; cmd_status ;;
  env) choice=$(torch_choice "${DDPJOB_IMAGE_TORCH:-}")
       printf 'export DDPJOB_TEST_IMAGE=%q\n' "$IMAGE"
       # What docker/build.sh then builds with by default: this machine's base, torch and pip.
       printf 'export DDPJOB_ENGINE=podman DDPJOB_BASE_IMAGE=%q DDPJOB_IMAGE_TORCH=%q DDPJOB_TORCH_INDEX_URL=%q DDPJOB_HOST_PIP=1\n' \
         "$BASE" "${choice%%$'\t'*}" "${choice#*$'\t'}" ;;
  purge) shift; locked __purge ;;
  __purge) cmd_purge ;;
  -h|--help|help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" ;;
  *) echo "usage: $0 up [--base IMAGE] [--torch REQUIREMENT] | status | env | purge" >&2; exit 2 ;;
esac
