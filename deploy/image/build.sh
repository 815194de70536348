#!/usr/bin/env bash
# Build deploy/Dockerfile with buildah on a machine that may have no container registry, and run
# commands in the result with podman. What CI and tests/deploy/test_image.py call.
#
#   deploy/image/build.sh build [cpu|gpu]      # prints the image name last; timings on stderr
#   deploy/image/build.sh run IMAGE [PODMAN-RUN-OPTIONS...] -- CMD...   # a container, removed after
#                                              # (host network; FACTORY_IMAGE_NETWORK=none: none)
#   deploy/image/build.sh size IMAGE           # bytes
#   deploy/image/build.sh podman ARGS...       # podman on the build's storage (images, inspect, rm)
#   deploy/image/build.sh buildah ARGS...      # buildah on that storage (factory/envs/image.py's layers)
#   deploy/image/build.sh base                 # the base image (pulled or made here), printed
#   deploy/image/build.sh clean                # every image, container and layer of that storage
#
# Base: $FACTORY_IMAGE_BASE if set, else docker.io/library/debian:bookworm-slim when a registry
# answers, else a Debian bookworm minbase made here with debootstrap from this machine's apt
# mirror and imported as localhost/debian-bookworm-minbase (kept: made once per storage root).
# pip: the build uses this machine's pip settings (`pip config list` and PIP_* variables: index,
# extra indexes, find-links, constraint, cert), the local paths they name mounted read-only under
# /mnt/host-pip; with any of them set, the Dockerfile's PyTorch CPU index is not added (the
# machine's own registry decides where torch comes from; $TORCH_INDEX_URL overrides).
# Storage: its own root, $FACTORY_IMAGE_ROOT (default /var/tmp/factory-image), overlay driver
# ($FACTORY_IMAGE_DRIVER=vfs where overlay mounts are refused), so nothing else's images are touched.
#
# Why these flags (found on a 6.x kernel VM, cgroup v1 + v2 hybrid, root without CAP_SYS_RESOURCE):
#   buildah --isolation chroot: RUN steps need no OCI runtime (crun refuses hybrid cgroups);
#   --network host: RUN steps reach the same pip registry and apt mirror as the host;
#   podman --runtime runc --cgroup-manager cgroupfs: crun fails "cgroups in hybrid mode not supported";
#   --ulimit nofile/nproc at or below the host's hard limits: podman's defaults (1048576 files, 4M
#   processes) cannot be raised to without CAP_SYS_RESOURCE ("setrlimit RLIMIT_NOFILE: Operation
#   not permitted").
set -euo pipefail
cd "$(dirname "$0")/../.."

ROOT=${FACTORY_IMAGE_ROOT:-/var/tmp/factory-image}
DRIVER=${FACTORY_IMAGE_DRIVER:-overlay}
PUBLIC_BASE=docker.io/library/debian:bookworm-slim
LOCAL_BASE=localhost/debian-bookworm-minbase:latest
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

mkdir -p "$ROOT"
export CONTAINERS_STORAGE_CONF="$ROOT/storage.conf"
[ -f "$CONTAINERS_STORAGE_CONF" ] || printf '[storage]\ndriver = "%s"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' \
  "$DRIVER" "$ROOT" "$ROOT" > "$CONTAINERS_STORAGE_CONF"

say() { echo "== $*" >&2; }
timed() {  # timed LABEL CMD...: run CMD, then print "time: LABEL S s" on stderr
  local label=$1 start=$SECONDS; shift
  "$@"; echo "time: $label $((SECONDS - start)) s" >&2
}

apt_mirror() {  # the Debian mirror this machine's apt uses (deb822 or one-line sources)
  local uri
  uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ && /bookworm( |$)/ && u ~ /debian\/?$/ {print u; exit}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

local_base() {  # debootstrap a bookworm minbase, trimmed like debian:bookworm-slim, and import it
  if buildah inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then echo "$LOCAL_BASE"; return; fi
  command -v debootstrap >/dev/null || { echo "no registry answers and debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
  local mirror rootfs
  mirror=$(apt_mirror); rootfs="$ROOT/rootfs"
  say "no registry: debootstrap --variant=minbase bookworm from $mirror"
  rm -rf "$rootfs"
  timed debootstrap debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$ROOT/debootstrap.log" 2>&1 \
    || { tail -20 "$ROOT/debootstrap.log" >&2; exit 1; }
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$mirror" "$mirror" "${mirror%/debian}/debian" > "$rootfs/etc/apt/sources.list"
  # what the official slim image excludes: docs, man pages, locales (the JDK alone ships ~40 MB of them)
  printf 'path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\npath-exclude /usr/share/man/*\npath-exclude /usr/share/locale/*\npath-exclude /usr/share/info/*\n' \
    > "$rootfs/etc/dpkg/dpkg.cfg.d/slim"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
  timed import sh -c "tar -C '$rootfs' -c . | podman import --quiet - '$LOCAL_BASE' >/dev/null"
  rm -rf "$rootfs"
  echo "$LOCAL_BASE"
}

pick_base() {
  if [ -n "${FACTORY_IMAGE_BASE:-}" ]; then echo "$FACTORY_IMAGE_BASE"; return; fi
  if buildah inspect --type image "$PUBLIC_BASE" >/dev/null 2>&1 \
     || timeout 60 buildah pull --quiet "$PUBLIC_BASE" >/dev/null 2>"$ROOT/pull.log"; then
    echo "$PUBLIC_BASE"; return
  fi
  say "$PUBLIC_BASE: $(tail -1 "$ROOT/pull.log")"
  local_base
}

# --build-arg and -v options that hand this machine's pip settings to the build
PIP_ARGS=()
pip_settings() {
  local py=python3 key value tok out settings=0
  [ -x .venv/bin/python ] && py=.venv/bin/python
  declare -A seen=()
  # `pip config list` prints env values (":env:.key") after the files', so the last one wins
  while IFS='=' read -r key value; do
    key=${key##*.}; value=${value#\'}; value=${value%\'}
    seen[$key]=$value
  done < <("$py" -m pip config list 2>/dev/null | grep -E '^[^=]*\.(index-url|extra-index-url|find-links|constraint|cert|default-timeout)=')
  for key in "${!seen[@]}"; do
    out=()
    for tok in ${seen[$key]}; do
      local path=${tok#file://}
      if [[ $path == /* && -e $path ]]; then
        # an index's pages link to its files by relative paths (simple/NAME/ -> ../../files/): mount its parent
        local mount=$path; [[ $key == *index-url ]] && mount=$(dirname "$path")
        PIP_ARGS+=(-v "$mount:/mnt/host-pip$mount:ro")
        tok=${tok%%/*}; [ "$tok" = file: ] && tok="file:///mnt/host-pip$path" || tok="/mnt/host-pip$path"
      fi
      out+=("$tok")
    done
    PIP_ARGS+=(--build-arg "PIP_$(echo "$key" | tr 'a-z-' 'A-Z_')=${out[*]}")
    [[ $key == *index-url || $key == find-links ]] && settings=1
  done
  if [ -n "${TORCH_INDEX_URL+set}" ]; then PIP_ARGS+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  elif [ $settings = 1 ]; then PIP_ARGS+=(--build-arg "TORCH_INDEX_URL="); fi
}

stamp() { local t0=$SECONDS line; while IFS= read -r line; do printf '%4d %s\n' $((SECONDS - t0)) "$line"; done; }

step_times() {  # "step: N s  RUN ..." for each STEP that took a second or more
  awk '/^ *[0-9]+ (\[[0-9]+\/[0-9]+\] )?STEP [0-9]+\/[0-9]+: / {
         if (name != "" && $1 - t >= 1) printf "step: %4d s  %s\n", $1 - t, substr(name, 1, 90)
         t = $1; name = substr($0, index($0, "STEP")); sub(/^STEP [0-9]+\/[0-9]+: /, "", name) }
       END { if (name != "") printf "step: %4d s  %s (and commit)\n", last - t, substr(name, 1, 90) }
       { last = $1 }' "$1"
}

build() {
  local variant=${1:-cpu} base tag sha start=$SECONDS
  case "$variant" in cpu|gpu) ;; *) echo "build.sh build: variant must be cpu or gpu, not '$variant'" >&2; exit 2;; esac
  command -v buildah >/dev/null || { echo "buildah is missing: apt-get install buildah podman runc" >&2; exit 1; }
  tag="localhost/model-factory:$VERSION-$variant"
  sha=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || sha="$sha-dirty"
  base=$(timed base pick_base)
  pip_settings
  say "buildah bud $tag from $base"
  local log="$ROOT/build-$variant.log"
  # every output line prefixed with the seconds since the build started, to time each STEP
  local t0=$SECONDS
  buildah bud --isolation chroot --network host --layers --force-rm \
    -f deploy/Dockerfile --build-arg "BASE=$base" --build-arg "VARIANT=$variant" --build-arg "CODE_VERSION=$sha" \
    "${PIP_ARGS[@]}" -t "$tag" . 2>&1 | stamp > "$log" || { grep -v 'is ignored: it is neither' "$log" | tail -30 >&2; exit 1; }
  step_times "$log" >&2
  echo "time: build $((SECONDS - t0)) s (log: $log)" >&2
  podman image prune --force >/dev/null  # the layers a pyproject change left behind (~5 GB each)
  echo "time: total $((SECONDS - start)) s" >&2
  echo "size: $(size "$tag") bytes" >&2
  echo "$tag"
}

run() {  # run IMAGE [OPTIONS...] -- CMD...
  local image=$1 hard_files; shift
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  hard_files=$(ulimit -Hn)
  command -v runc >/dev/null || { echo "runc is missing: apt-get install runc" >&2; exit 1; }
  exec podman --runtime runc --cgroup-manager cgroupfs run --rm --network "${FACTORY_IMAGE_NETWORK:-host}" \
    --ulimit "nofile=$hard_files:$hard_files" --ulimit "nproc=${FACTORY_IMAGE_NPROC:-32768}:${FACTORY_IMAGE_NPROC:-32768}" \
    "${opts[@]}" "$image" "$@"
}

size() { podman image inspect --format '{{.Size}}' "$1"; }

case "${1:-}" in
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  size) shift; size "$@" ;;
  podman) shift; exec podman "$@" ;;  # podman on this storage root (inspect, rm, images)
  buildah) shift; exec buildah "$@" ;;
  base) pick_base ;;
  clean) buildah rm --all >/dev/null; podman system reset --force >/dev/null 2>&1; rm -rf "$ROOT" ;;
  *) echo "usage: build.sh build [cpu|gpu] | run IMAGE [OPTIONS] -- CMD... | size IMAGE | podman ARGS... | buildah ARGS... | base | clean" >&2; exit 2 ;;
esac
