"""CLI parsing: defaults come from the config dataclasses; file < env < flags."""

from __future__ import annotations

import pytest

from eagle_core.config import EngineConfig
from server.args import ConfigError, build_parser, parse_args
from server.settings import ServerSettings


def test_defaults_are_the_dataclass_defaults():
    engine, server = parse_args([], environ={})
    assert engine == EngineConfig()
    assert server == ServerSettings()
    assert server.host == "127.0.0.1" and server.port == 8000


def test_flags_map_onto_config_fields():
    engine, server = parse_args(
        [
            "--model",
            "/m",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-num-seqs",
            "4",
            "--max-model-len",
            "1024",
            "--kv-cache-tokens",
            "4096",
            "--max-waiting",
            "9",
            "--max-num-batched-tokens",
            "256",
            "--draft",
            "/d",
            "--num-draft-tokens",
            "8",
            "--draft-depth",
            "3",
            "--draft-top-k",
            "2",
            "--draft-quantization",
            "none",
            "--port",
            "9000",
            "--host",
            "0.0.0.0",
            "--api-key",
            "k",
            "--allowed-origins",
            "http://a, http://b",
            "--served-model-name",
            "mine",
            "--max-request-bytes",
            "10",
            "--log-level",
            "debug",
        ],
        environ={},
    )
    assert engine.model.model == "/m" and engine.model.dtype == "float32"
    assert engine.model.device == "cpu" and engine.model.max_model_len == 1024
    assert engine.scheduler.max_num_seqs == 4 and engine.scheduler.max_waiting == 9
    assert engine.scheduler.max_num_batched_tokens == 256
    assert engine.cache.kv_cache_tokens == 4096
    assert (
        engine.spec.draft,
        engine.spec.num_draft_tokens,
        engine.spec.depth,
        engine.spec.top_k,
        engine.spec.draft_quantization,
    ) == (
        "/d",
        8,
        3,
        2,
        "none",
    )
    assert server == ServerSettings(
        host="0.0.0.0",
        port=9000,
        served_model_name="mine",
        api_key="k",
        allowed_origins=("http://a", "http://b"),
        max_request_bytes=10,
        log_level="debug",
    )


def test_no_speculation_clears_the_draft():
    engine, _ = parse_args(["--draft", "/d", "--no-speculation"], environ={})
    assert engine.spec.draft is None


def test_precedence_file_then_env_then_flags(tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("port: 7000\nmax-num-seqs: 3\napi_key: from-file\nallowed_origins: ['*']\n")
    env = {"EAGLE_SERVE_PORT": "7100", "EAGLE_SERVE_API_KEY": "from-env"}
    engine, server = parse_args(["--config", str(cfg), "--port", "7200"], environ=env)
    assert server.port == 7200  # flag beats env and file
    assert server.api_key == "from-env"  # env beats file
    assert engine.scheduler.max_num_seqs == 3  # file beats default
    assert server.allowed_origins == ("*",)
    _, server = parse_args(["--config", str(cfg)], environ={})
    assert server.port == 7000


def test_env_only_and_config_from_env(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("no_speculation: true\ndraft: /d\n")
    engine, server = parse_args(
        [], environ={"EAGLE_SERVE_MODEL": "/env-model", "EAGLE_SERVE_CONFIG": str(cfg)}
    )
    assert engine.model.model == "/env-model"
    assert engine.spec.draft is None


def test_shutdown_timeout():
    _, server = parse_args([], environ={})
    assert server.shutdown_timeout_s == 30.0
    _, server = parse_args(["--shutdown-timeout", "2.5"], environ={})
    assert server.shutdown_timeout_s == 2.5


def test_optional_values_accept_none(tmp_path):
    engine, _ = parse_args(["--max-model-len", "none"], environ={})
    assert engine.model.max_model_len is None


def test_deterministic_flag():
    assert not parse_args([], environ={})[0].model.deterministic
    assert parse_args(["--deterministic", "true"], environ={})[0].model.deterministic
    assert parse_args([], environ={"EAGLE_SERVE_DETERMINISTIC": "1"})[0].model.deterministic


@pytest.mark.parametrize(
    ("argv", "env", "match"),
    [
        (["--port", "eighty"], {}, "port"),
        ([], {"EAGLE_SERVE_MAX_NUM_SEQS": "many"}, "max_num_seqs"),
        ([], {"EAGLE_SERVE_NO_SPECULATION": "maybe"}, "no_speculation"),
        (["--config", "/nonexistent.yaml"], {}, "not found"),
        (["--shutdown-timeout", "-1"], {}, "shutdown_timeout"),
        (["--deterministic", "true", "--compile", "on"], {}, "deterministic mode runs eagerly"),
        (["--deterministic", "yes", "--attention-backend", "paged"], {}, "attention_backend must be auto"),
        # numbers out of range, which the engine would otherwise take and fail on later
        (["--max-num-seqs", "-3"], {}, "max_num_seqs must be at least 1"),
        (["--max-num-batched-tokens", "0"], {}, "max_num_batched_tokens must be at least 1"),
        (["--max-waiting", "-1"], {}, "max_waiting must be at least 0"),
        (["--block-size", "-1"], {}, "block_size must be at least 1"),
        (["--kv-cache-tokens", "0"], {}, "kv_cache_tokens must be at least 1"),
        (["--kv-cache-memory-gb", "-1"], {}, "kv_cache_memory_gb must be positive"),
        (["--max-model-len", "-5"], {}, "max_model_len must be at least 1"),
        (["--port", "70000"], {}, "port must be between"),
        (["--max-request-bytes", "0"], {}, "max_request_bytes must be at least 1"),
    ],
)
def test_bad_values_raise_config_error(argv, env, match):
    with pytest.raises(ConfigError, match=match):
        parse_args(argv, environ=env)


def test_unknown_config_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_sequences: 3\n")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_args(["--config", str(cfg)], environ={})


def test_unknown_flag_and_bad_choice_exit():
    with pytest.raises(SystemExit):
        parse_args(["--max-num-sequences", "3"], environ={})
    with pytest.raises(SystemExit):
        parse_args(["--dtype", "int3"], environ={})
    with pytest.raises(SystemExit):
        parse_args(["--draft-quantization", "int4"], environ={})


def test_help_shows_defaults():
    text = build_parser().format_help()
    assert "(default: 32)" in text  # max_num_seqs
    assert "EAGLE_SERVE_API_KEY" in text


@pytest.mark.parametrize("path", ["configs/server.yaml"])
def test_shipped_config_files_parse(path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / path).exists():
        pytest.skip(f"{path} not present")
    parse_args(["--config", str(root / path)], environ={})
