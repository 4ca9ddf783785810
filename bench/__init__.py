"""Benchmarks: serve_bench (the HTTP suite behind `make bench`), engine_throughput (offline)."""
