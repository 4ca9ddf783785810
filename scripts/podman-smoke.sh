#!/usr/bin/env bash
# The image smoke test with podman on a machine that reaches no container registry (only PyPI
# and a Debian mirror): build a local Debian bookworm base image once
# (scripts/podman-base-image.sh), then run scripts/docker-smoke.sh with podman, that base, torch
# from a local wheel folder and the build on the host network.
#
# Usage: scripts/podman-smoke.sh          (as root; apt-get install -y podman debootstrap)
#
# Environment (all optional; the rest is passed through to docker-smoke.sh, e.g. SMOKE_KEEP_IMAGE):
#   PYTHON_IMAGE          base image tag               (default: localhost/eagle-base:bookworm,
#                         built when missing)
#   SMOKE_WHEELS_DIR      local wheels for the build   (default: pip's find-links, /opt/wheels
#                         here, which holds the torch CPU wheel; empty string: none)
#   TORCH_INDEX_URL       index for torch              (default: https://pypi.org/simple: with
#                         the local torch-X+cpu wheel, pip picks it over PyPI's CUDA torch-X)
#   SMOKE_BUILD_NETWORK   build network                (default: host)
#   SMOKE_PIP_CERT        CA bundle for pip            (default: pip's `cert` setting, if any)
#   CONTAINER_ENGINE_OPTS global podman options        (default: probed, see below)
#   SMOKE_ULIMITS         --ulimit values              (default: probed, see below)
#
# The probe: a container of the base image runs `true` with podman's defaults; if that fails
# (sandboxes without CAP_SYS_RESOURCE, where podman's default ulimits cannot be set, or with a
# cgroup v1/v2 hybrid that crun refuses), it retries with `--runtime runc` and ulimits no higher
# than this shell's hard limits, and uses that if it works. Setting CONTAINER_ENGINE_OPTS or
# SMOKE_ULIMITS (even to "") skips the probe.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { printf '[podman-smoke] %s\n' "$*" >&2; }

command -v podman >/dev/null 2>&1 || { log "FAILED: podman not found (apt-get install -y podman)"; exit 1; }

export CONTAINER_ENGINE=podman
export PYTHON_IMAGE=${PYTHON_IMAGE:-localhost/eagle-base:bookworm}
if [[ -z ${SMOKE_WHEELS_DIR+set} ]]; then
  # pip's own setting on this host (environment, then pip.conf), else /opt/wheels if present.
  SMOKE_WHEELS_DIR=${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}
  SMOKE_WHEELS_DIR=${SMOKE_WHEELS_DIR%% *}
  [[ -z $SMOKE_WHEELS_DIR && -d /opt/wheels ]] && SMOKE_WHEELS_DIR=/opt/wheels
fi
export SMOKE_WHEELS_DIR
if [[ -z ${SMOKE_PIP_CERT+set} ]]; then
  SMOKE_PIP_CERT=${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}
fi
export SMOKE_PIP_CERT
export TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://pypi.org/simple}
export SMOKE_BUILD_NETWORK=${SMOKE_BUILD_NETWORK:-host}
export SMOKE_REQUIRE_ENGINE=${SMOKE_REQUIRE_ENGINE:-1}

if [[ $PYTHON_IMAGE == localhost/* ]]; then
  BASE_IMAGE=$PYTHON_IMAGE "$here/podman-base-image.sh"
fi
if [[ -z ${CONTAINER_ENGINE_OPTS+set} && -z ${SMOKE_ULIMITS+set} ]]; then
  CONTAINER_ENGINE_OPTS=
  SMOKE_ULIMITS=
  if ! probe=$(podman run --rm "$PYTHON_IMAGE" true 2>&1); then
    log "podman's defaults fail here: ${probe}"
    nproc=$(ulimit -Hu)
    [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
    limits="nofile=$(ulimit -Hn):$(ulimit -Hn) nproc=${nproc}:${nproc}"
    read -r -a probe_ulimits <<<"${limits// / --ulimit }"
    if probe=$(podman --runtime runc run --rm --ulimit "${probe_ulimits[@]}" "$PYTHON_IMAGE" true 2>&1); then
      CONTAINER_ENGINE_OPTS="--runtime runc"
      SMOKE_ULIMITS=$limits
    else
      log "FAILED: nor with --runtime runc --ulimit ${limits// / --ulimit }: ${probe}"
      exit 1
    fi
  fi
fi
export CONTAINER_ENGINE_OPTS SMOKE_ULIMITS
log "engine options '${CONTAINER_ENGINE_OPTS}', ulimits '${SMOKE_ULIMITS}'"
log "base ${PYTHON_IMAGE}, wheels ${SMOKE_WHEELS_DIR:-(none)}, torch index ${TORCH_INDEX_URL}"
exec "$here/docker-smoke.sh"
