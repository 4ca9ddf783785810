#!/usr/bin/env bash
# Build a local Debian bookworm base image (Python 3.11 with venv) for machines that reach no
# container registry: debootstrap a minimal root filesystem from a Debian mirror and import it
# into podman. The Dockerfile then builds on it through `--build-arg PYTHON_IMAGE=<tag>`
# (scripts/podman-smoke.sh does that).
#
# Usage: scripts/podman-base-image.sh          (as root; needs debootstrap and podman)
#
# Environment (all optional):
#   BASE_IMAGE       tag to create                       (default: localhost/eagle-base:bookworm)
#   BASE_SUITE       Debian suite                        (default: bookworm, whose python3 is 3.11)
#   BASE_MIRROR      Debian mirror    (default: the first deb.debian.org-style URI in apt's sources)
#   BASE_WORKDIR     where the root filesystem is built  (default: /var/tmp/eagle-base)
#   BASE_FORCE       1 to rebuild when the image exists  (default: 0)
#   CONTAINER_ENGINE_OPTS  global podman options, e.g. "--storage-driver vfs"
set -euo pipefail

image=${BASE_IMAGE:-localhost/eagle-base:bookworm}
suite=${BASE_SUITE:-bookworm}
workdir=${BASE_WORKDIR:-/var/tmp/eagle-base}
read -r -a engine_opts <<<"${CONTAINER_ENGINE_OPTS:-}"

log() { printf '[podman-base-image] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
podman_() { podman ${engine_opts[@]+"${engine_opts[@]}"} "$@"; }

command -v podman >/dev/null 2>&1 || die "podman not found (apt-get install -y podman)"
if [[ ${BASE_FORCE:-0} != 1 ]] && podman_ image exists "$image"; then
  log "${image} exists (BASE_FORCE=1 rebuilds it)"
  exit 0
fi
[[ $(id -u) == 0 ]] || die "debootstrap needs root"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (apt-get install -y debootstrap)"

mirror=${BASE_MIRROR:-}
if [[ -z $mirror ]]; then
  # The mirror apt already uses: deb822 (URIs:) or one-line (deb URI suite ...) sources.
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)$/\1/p' \
             -e 's/^deb[[:space:]]\{1,\}\([^[:space:]]*\/debian\)[[:space:]].*/\1/p' \
    | head -n 1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi

rootfs="${workdir}/rootfs"
# Never rm -rf a tree with /proc or /sys still mounted in it (an interrupted debootstrap).
if grep -q " ${rootfs}/" /proc/mounts; then
  die "something is still mounted under ${rootfs}: unmount it first"
fi
rm -rf "$rootfs"
mkdir -p "$workdir"
# minbase: essential packages, apt and the `passwd` tools the Dockerfile's useradd needs.
# python3-venv brings python3 (3.11 on bookworm) and ensurepip; ca-certificates lets pip use TLS.
log "debootstrap ${suite} from ${mirror} into ${rootfs}"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$suite" "$rootfs" "$mirror"

# Smaller image: no package lists, caches, docs or man pages.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
  "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log

# Checked here, not in a container: running one may need the options podman-smoke.sh probes.
chroot "$rootfs" python3 -c 'import sys, venv, ssl, ensurepip; print("python", sys.version.split()[0])'

log "importing ${rootfs} as ${image}"
tar --numeric-owner -C "$rootfs" -c . \
  | podman_ import --change 'CMD ["/usr/bin/python3"]' --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null
rm -rf "$rootfs"
log "done: ${image} ($(podman_ image inspect -f '{{.Size}}' "$image") bytes)"
