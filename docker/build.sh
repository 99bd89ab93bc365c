#!/usr/bin/env bash
# Build the training image (docker/Dockerfile) with docker, podman or buildah; print its image id.
#
#   docker/build.sh [--engine podman|docker|buildah] [--base IMAGE] [--tag TAG]
#                   [--torch REQUIREMENT] [--torch-index auto|URL|''] [--context DIR]
#                   [--pip-conf FILE] [--pip-cert FILE] [--pip-mount PATH]... [--host-pip] [--no-cache]
#
#   --engine       default: $DDPJOB_ENGINE, else the first of podman, docker, buildah on PATH
#   --base         BASE_IMAGE (default: the Dockerfile's CUDA 13.0 base; debian:bookworm-slim
#                  gives the CPU variant: the CPU wheels of the pinned torch)
#   --tag          the image's name (default ddpjob-train:dev)
#   --torch        TORCH_REQUIREMENT, e.g. 'torch==2.13.0': this torch instead of the train extra's pins
#   --torch-index  TORCH_INDEX_URL (default auto: see the Dockerfile)
#   --no-cache     build every step again (the engine's layer cache is used otherwise)
#   --pip-conf     a pip configuration file, passed as the build secret "pip.conf"
#   --pip-cert     a CA bundle for pip, passed as the build secret "pip-cert"
#   --pip-mount    a local path the pip configuration names (find-links, a file:// index, a
#                  constraints file), bind-mounted read-only at the same path during the build
#                  (podman and buildah; docker's builds cannot mount host paths)
#   --host-pip     all three from this machine's `pip config list` (${PIP:-pip}): its settings
#                  become the secret pip.conf, its `cert` the secret pip-cert, and the local paths
#                  it names are mounted (a file:// index: its parent folder, where its files lie)
#
# Defaults come from DDPJOB_ENGINE, DDPJOB_BASE_IMAGE, DDPJOB_IMAGE_TORCH, DDPJOB_TORCH_INDEX_URL and
# DDPJOB_HOST_PIP=1 where set: `eval "$(docker/engine.sh env)"` sets them for a machine prepared by
# `docker/engine.sh up` (its debootstrap base, its CPU torch, its pip configuration).
#
# Nothing of the pip configuration lands in a layer: secrets and mounts exist only while a RUN
# step runs. The build log goes to stderr; stdout gets one line, the image id.
# Exit codes: 0 built, 1 the build failed, 2 bad usage, 3 the engine is not installed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf 'docker/build.sh: %s\n' "$*" >&2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2; }

# Defaults from the environment (`eval "$(docker/engine.sh env)"` sets them for this machine).
engine=${DDPJOB_ENGINE:-}
base=${DDPJOB_BASE_IMAGE:-}
tag=ddpjob-train:dev
torch=${DDPJOB_IMAGE_TORCH:-}
torch_index=${DDPJOB_TORCH_INDEX_URL-auto}
context=$REPO
pip_conf=""
pip_cert=""
host_pip=${DDPJOB_HOST_PIP:-0}
no_cache=0
mounts=()

need_value() { [ $# -ge 2 ] || { log "error: $1 needs a value"; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) need_value "$@"; engine=$2; shift 2 ;;
    --base) need_value "$@"; base=$2; shift 2 ;;
    --tag) need_value "$@"; tag=$2; shift 2 ;;
    --torch) need_value "$@"; torch=$2; shift 2 ;;
    --torch-index) need_value "$@"; torch_index=$2; shift 2 ;;
    --context) need_value "$@"; context=$2; shift 2 ;;
    --pip-conf) need_value "$@"; pip_conf=$2; shift 2 ;;
    --pip-cert) need_value "$@"; pip_cert=$2; shift 2 ;;
    --pip-mount) need_value "$@"; mounts+=("$2"); shift 2 ;;
    --host-pip) host_pip=1; shift ;;
    --no-cache) no_cache=1; shift ;;
    -h|--help) usage ;;
    *) log "error: unknown argument '$1'"; usage ;;
  esac
done

if [ -z "$engine" ]; then
  for e in podman docker buildah; do
    if command -v "$e" >/dev/null 2>&1; then engine=$e; break; fi
  done
  [ -n "$engine" ] || { log "error: no container engine found (podman, docker or buildah); docker/engine.sh up installs podman on Debian"; exit 3; }
fi
case "$engine" in
  podman|docker|buildah) ;;
  *) log "error: --engine must be podman, docker or buildah (got '$engine')"; exit 2 ;;
esac
for f in "$pip_conf" "$pip_cert"; do
  if [ -n "$f" ] && [ ! -f "$f" ]; then log "error: $f is not a file"; exit 2; fi
done
check_mounts() {
  local m
  [ "${#mounts[@]}" -gt 0 ] || return 0
  if [ "$engine" = docker ]; then
    log "error: docker's builds cannot mount host paths (${mounts[*]}); use --engine podman or buildah, or a pip configuration with http(s) indexes only"
    exit 2
  fi
  for m in "${mounts[@]}"; do
    case "$m" in /*) ;; *) log "error: --pip-mount needs an absolute path (got '$m')"; exit 2 ;; esac
    case "$m" in *:*|*,*) log "error: cannot mount '$m' (':' or ',' in the path)"; exit 2 ;; esac
    [ -e "$m" ] || { log "error: --pip-mount $m does not exist"; exit 2; }
  done
}
check_mounts
command -v "$engine" >/dev/null 2>&1 || { log "error: $engine is not installed"; exit 3; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 700 "$tmp"

if [ "$host_pip" = 1 ]; then
  # This machine's pip settings (files and PIP_* variables, as `pip config list` shows them) as
  # one configuration file; the certificate separately (a host path means nothing in the build).
  "${PIP:-pip}" config list > "$tmp/pip-config-list" 2>/dev/null || { log "error: '${PIP:-pip} config list' failed"; exit 2; }
  python3 - "$tmp/pip-config-list" "$tmp" <<'PY' > "$tmp/host-pip"
import configparser, os, shlex, sys
from urllib.parse import unquote, urlparse

listing, out = sys.argv[1], sys.argv[2]
settings = {}
for line in open(listing, encoding="utf-8"):
    key, sep, value = line.rstrip("\n").partition("=")
    if not sep or "." not in key:
        continue
    section, name = key.rsplit(".", 1)
    section = "global" if section in (":env:", "") else section  # PIP_* variables apply everywhere
    words = shlex.split(value)
    settings[(section, name)] = " ".join(words)
cert = ""
paths = []
conf = configparser.ConfigParser(interpolation=None)
for (section, name), value in sorted(settings.items(), key=lambda kv: kv[0][0] != "global"):
    if name == "cert":
        cert = value
        continue
    for word in value.split():
        if word.startswith("file://"):
            path = unquote(urlparse(word).path).rstrip("/")
            # A file:// index (.../simple) links to its files beside it (../../files): mount its parent.
            paths.append(os.path.dirname(path) if name in ("index-url", "extra-index-url") else path)
        elif word.startswith("/") and os.path.exists(word):
            paths.append(word)
    if not conf.has_section(section):
        conf.add_section(section)
    conf.set(section, name, value)
with open(os.path.join(out, "pip.conf"), "w", encoding="utf-8") as f:
    f.write("# This machine's pip configuration, passed by docker/build.sh as a build secret; never in a layer\n")
    conf.write(f)
print(f"conf\t{os.path.join(out, 'pip.conf')}")
if cert:
    print(f"cert\t{cert}")
for p in dict.fromkeys(paths):
    print(f"mount\t{p}")
PY
  while IFS=$'\t' read -r kind value; do
    case "$kind" in
      conf) [ -n "$pip_conf" ] || pip_conf=$value ;;
      cert) [ -n "$pip_cert" ] || pip_cert=$value ;;
      mount) mounts+=("$value") ;;
    esac
  done < "$tmp/host-pip"
fi

args=(-f "$REPO/docker/Dockerfile" -t "$tag" --iidfile "$tmp/iid" --build-arg "TORCH_INDEX_URL=$torch_index")
[ "$no_cache" = 0 ] || args+=(--no-cache)
[ -z "$base" ] || args+=(--build-arg "BASE_IMAGE=$base")
[ -z "$torch" ] || args+=(--build-arg "TORCH_REQUIREMENT=$torch")
[ -z "$pip_conf" ] || args+=(--secret "id=pip.conf,src=$pip_conf")
[ -z "$pip_cert" ] || args+=(--secret "id=pip-cert,src=$pip_cert")
check_mounts  # again: --host-pip may have added some
for m in ${mounts[@]+"${mounts[@]}"}; do args+=(-v "$m:$m:ro"); done

# Builds use the host's network (NOTES: the engines' own networks do not reach out on machines like this one).
case "$engine" in
  podman) cmd=(podman build --network=host "${args[@]}" "$context") ;;
  buildah) cmd=(buildah build --network=host "${args[@]}" "$context") ;;
  docker) cmd=(env DOCKER_BUILDKIT=1 docker build --network=host "${args[@]}" "$context") ;;
esac
log "$(printf '%q ' "${cmd[@]}")"
start=$(date +%s)
if ! "${cmd[@]}" >&2; then
  log "error: the build failed (exit above)"
  exit 1
fi
log "built $tag in $(( $(date +%s) - start ))s"
cat "$tmp/iid"
echo
