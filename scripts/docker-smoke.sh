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
#   EAGLE_SERVE_API_KEY   when set, passed to the server and sent as the bearer token
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

log() { printf '[docker-smoke] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

find_engine() {
  local candidates=("${CONTAINER_ENGINE:-}")
  [[ -n ${CONTAINER_ENGINE:-} ]] || candidates=(docker podman)
  local engine
  for engine in "${candidates[@]}"; do
    if command -v "$engine" >/dev/null 2>&1 && "$engine" info >/dev/null 2>&1; then
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
  if [[ $status -ne 0 ]] && "$engine" container inspect "$container" >/dev/null 2>&1; then
    log "container log (last 50 lines):"
    "$engine" logs --tail 50 "$container" >&2 || true
  fi
  "$engine" rm -f "$container" >/dev/null 2>&1 || true
  if [[ ${SMOKE_KEEP_IMAGE:-0} != 1 && ${SMOKE_BUILD:-1} == 1 ]]; then
    "$engine" rmi "$image" >/dev/null 2>&1 || true
  fi
  exit "$status"
}
trap cleanup EXIT

if [[ ${SMOKE_BUILD:-1} == 1 ]]; then
  build_args=()
  [[ -n ${TORCH_INDEX_URL:-} ]] && build_args+=(--build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL}")
  log "building ${image} with ${engine} (CPU torch; the first build downloads ~1 GB)"
  "$engine" build ${build_args[@]+"${build_args[@]}"} -t "$image" "$repo_root"
fi

run_args=(-d --name "$container" -p "127.0.0.1:${port}:8000")
auth=()
if [[ -n ${EAGLE_SERVE_API_KEY:-} ]]; then
  run_args+=(-e EAGLE_SERVE_API_KEY)
  auth=(-H "Authorization: Bearer ${EAGLE_SERVE_API_KEY}")
fi
log "starting ${container} on ${base}"
"$engine" run "${run_args[@]}" "$image" >/dev/null

log "waiting up to ${timeout}s for ${base}/health"
deadline=$((SECONDS + timeout))
until [[ $(curl -s -o /dev/null -w '%{http_code}' "${base}/health" || true) == 200 ]]; do
  running=$("$engine" container inspect -f '{{.State.Running}}' "$container" 2>/dev/null || echo false)
  [[ $running == true ]] || die "the container exited before /health answered 200"
  ((SECONDS < deadline)) || die "/health did not answer 200 within ${timeout}s"
  sleep 2
done
log "healthy after ${SECONDS}s"

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
