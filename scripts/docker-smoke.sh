#!/usr/bin/env bash
# Smoke test of the container image: build the CPU image, start it, wait until /health answers
# 200, send one chat completion (plain and streamed), check /metrics, and remove the container.
#
# Usage: scripts/docker-smoke.sh
#
# Environment (all optional):
#   CONTAINER_ENGINE      docker or podman (default: the first of them whose daemon answers)
#   SMOKE_IMAGE           image tag to build and run        (default: eagle-serve:smoke)
#   SMOKE_PORT            host port for the API, on 127.0.0.1 (default: 18000)
#   SMOKE_TIMEOUT         seconds to wait for /health         (default: 600)
#   SMOKE_BUILD           0 to run an already built SMOKE_IMAGE (default: 1)
#   SMOKE_KEEP_IMAGE      1 to keep the image afterwards      (default: 0, the image is removed)
#   SMOKE_REQUIRE_ENGINE  1 to fail, not skip, when no engine is usable (default: 0)
#   TORCH_INDEX_URL       passed to the build as a build argument (default: the Dockerfile's)
#   PYTHON_IMAGE          base image, passed as a build argument (default: the Dockerfile's
#                         python:3.11-slim-bookworm; scripts/podman-base-image.sh makes a local one)
#   SMOKE_WHEELS_DIR      a host folder of wheels (e.g. /opt/wheels with the torch CPU wheel),
#                         mounted into the build at /wheels with PIP_FIND_LINKS=/wheels (podman
#                         only: `docker build` cannot mount host folders)
#   SMOKE_PIP_CERT        a host CA bundle for pip in the build (TLS-intercepting proxies),
#                         mounted at /etc/pip-ca.crt with PIP_CERT set to it (podman only)
#   SMOKE_BUILD_NETWORK   --network for the build, e.g. host          (default: the engine's)
#   SMOKE_ULIMITS         space-separated --ulimit values for build and run, for hosts that do not
#                         let the runtime raise the engine's defaults, e.g.
#                         "nofile=20000:20000 nproc=32768:32768"      (default: none)
#   CONTAINER_ENGINE_OPTS global engine options, word-split, e.g. "--storage-driver vfs"
#   EAGLE_SERVE_API_KEY   when set, passed to the server and sent as the bearer token
#
# scripts/podman-smoke.sh sets these for a machine without registry access.
#
# Exit status: 0 on success, and also when no container engine is usable (a "SKIPPED" line says
# so; SMOKE_REQUIRE_ENGINE=1 makes that exit 1), 1 when any step fails.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=${SMOKE_IMAGE:-eagle-serve:smoke}
port=${SMOKE_PORT:-18000}
timeout=${SMOKE_TIMEOUT:-600}
container="eagle-serve-smoke-$$"
base="http://127.0.0.1:${port}"

read -r -a engine_opts <<<"${CONTAINER_ENGINE_OPTS:-}"

log() { printf '[docker-smoke] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
# The engine with its global options (set once `engine` is known).
eng() { "$engine" ${engine_opts[@]+"${engine_opts[@]}"} "$@"; }

find_engine() {
  local candidates=("${CONTAINER_ENGINE:-}")
  [[ -n ${CONTAINER_ENGINE:-} ]] || candidates=(docker podman)
  local engine
  for engine in "${candidates[@]}"; do
    if command -v "$engine" >/dev/null 2>&1 \
      && "$engine" ${engine_opts[@]+"${engine_opts[@]}"} info >/dev/null 2>&1; then
      echo "$engine"
      return 0
    fi
  done
  return 1
}

if ! engine=$(find_engine); then
  msg="no usable container engine (tried: ${CONTAINER_ENGINE:-docker podman}; the CLI is missing or its daemon does not answer)"
  if [[ ${SMOKE_REQUIRE_ENGINE:-0} == 1 ]]; then
    die "$msg"
  fi
  log "SKIPPED: $msg"
  exit 0
fi
command -v curl >/dev/null 2>&1 || die "curl is needed on the host"

cleanup() {
  local status=$?
  if [[ $status -ne 0 ]] && eng container inspect "$container" >/dev/null 2>&1; then
    log "container log (last 50 lines):"
    eng logs --tail 50 "$container" >&2 || true
  fi
  eng rm -f "$container" >/dev/null 2>&1 || true
  if [[ ${SMOKE_KEEP_IMAGE:-0} != 1 && ${SMOKE_BUILD:-1} == 1 ]]; then
    eng rmi "$image" >/dev/null 2>&1 || true
  fi
  exit "$status"
}
trap cleanup EXIT

ulimit_args=()
read -r -a ulimits <<<"${SMOKE_ULIMITS:-}"
for limit in ${ulimits[@]+"${ulimits[@]}"}; do
  ulimit_args+=(--ulimit "$limit")
done

if [[ ${SMOKE_BUILD:-1} == 1 ]]; then
  build_args=()
  [[ -n ${TORCH_INDEX_URL:-} ]] && build_args+=(--build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL}")
  [[ -n ${PYTHON_IMAGE:-} ]] && build_args+=(--build-arg "PYTHON_IMAGE=${PYTHON_IMAGE}")
  [[ -n ${SMOKE_BUILD_NETWORK:-} ]] && build_args+=(--network "${SMOKE_BUILD_NETWORK}")
  if [[ -n ${SMOKE_WHEELS_DIR:-} ]]; then
    [[ -d $SMOKE_WHEELS_DIR ]] || die "SMOKE_WHEELS_DIR=${SMOKE_WHEELS_DIR} is not a folder"
    [[ $(basename "$engine") == podman* ]] || die "SMOKE_WHEELS_DIR needs podman (build -v)"
    build_args+=(-v "${SMOKE_WHEELS_DIR}:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels)
  fi
  if [[ -n ${SMOKE_PIP_CERT:-} ]]; then
    [[ -f $SMOKE_PIP_CERT ]] || die "SMOKE_PIP_CERT=${SMOKE_PIP_CERT} is not a file"
    [[ $(basename "$engine") == podman* ]] || die "SMOKE_PIP_CERT needs podman (build -v)"
    build_args+=(-v "${SMOKE_PIP_CERT}:/etc/pip-ca.crt:ro" --build-arg PIP_CERT=/etc/pip-ca.crt)
  fi
  build_args+=(${ulimit_args[@]+"${ulimit_args[@]}"})
  # Podman writes OCI images by default, which drop HEALTHCHECK; the docker format keeps it.
  [[ $(basename "$engine") == podman* ]] && build_args+=(--format docker)
  log "building ${image} with ${engine} (CPU torch; the first build downloads ~1 GB)"
  build_start=$SECONDS
  eng build ${build_args[@]+"${build_args[@]}"} -t "$image" "$repo_root"
  log "built in $((SECONDS - build_start))s"
fi
size=$(eng image inspect -f '{{.Size}}' "$image" 2>/dev/null || true)
[[ $size =~ ^[0-9]+$ ]] && log "image ${image}: $((size / 1000000)) MB"

run_args=(-d --name "$container" -p "127.0.0.1:${port}:8000" ${ulimit_args[@]+"${ulimit_args[@]}"})
auth=()
if [[ -n ${EAGLE_SERVE_API_KEY:-} ]]; then
  run_args+=(-e EAGLE_SERVE_API_KEY)
  auth=(-H "Authorization: Bearer ${EAGLE_SERVE_API_KEY}")
fi
log "starting ${container} on ${base}"
run_start=$SECONDS
eng run "${run_args[@]}" "$image" >/dev/null

log "waiting up to ${timeout}s for ${base}/health"
deadline=$((SECONDS + timeout))
until [[ $(curl -s -o /dev/null -w '%{http_code}' "${base}/health" || true) == 200 ]]; do
  running=$(eng container inspect -f '{{.State.Running}}' "$container" 2>/dev/null || echo false)
  [[ $running == true ]] || die "the container exited before /health answered 200"
  ((SECONDS < deadline)) || die "/health did not answer 200 within ${timeout}s"
  sleep 2
done
log "healthy $((SECONDS - run_start))s after the start"
log "in the container: $(eng exec "$container" python3 -c \
  'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' || true)"

models=$(curl -fsS ${auth[@]+"${auth[@]}"} "${base}/v1/models") || die "GET /v1/models"
# Here-strings and [[ =~ ]] rather than pipes: with pipefail, `printf | grep -q` can fail when
# grep exits early and printf gets SIGPIPE on a large /metrics page.
id_pattern='"id"[[:space:]]*:[[:space:]]*"([^"]+)"'
[[ $models =~ $id_pattern ]] || die "GET /v1/models listed no model: ${models}"
model=${BASH_REMATCH[1]}
log "model: ${model}"

body=$(printf '{"model": "%s", "messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 16, "temperature": 0}' "$model")
reply=$(curl -fsS ${auth[@]+"${auth[@]}"} -H 'Content-Type: application/json' -d "$body" "${base}/v1/chat/completions") \
  || die "POST /v1/chat/completions"
grep -q '"choices"' <<<"$reply" || die "chat completion without choices: ${reply}"
log "chat completion: ${reply}"

stream_body=${body%\}}', "stream": true}'
stream=$(curl -fsSN ${auth[@]+"${auth[@]}"} -H 'Content-Type: application/json' -d "$stream_body" "${base}/v1/chat/completions") \
  || die "POST /v1/chat/completions (stream)"
grep -q '^data: \[DONE\]' <<<"$stream" || die "stream did not end with data: [DONE]: ${stream}"
log "streamed chat completion: $(grep -c '^data: ' <<<"$stream") events"

metrics=$(curl -fsS ${auth[@]+"${auth[@]}"} "${base}/metrics") || die "GET /metrics"
for name in eagle_request_success_total eagle_time_to_first_token_seconds_bucket eagle_generation_tokens_total; do
  grep -q "^${name}" <<<"$metrics" || die "/metrics has no ${name}"
done
log "metrics exported"

log "PASSED"
