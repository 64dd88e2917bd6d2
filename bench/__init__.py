"""Benchmarks of the embedding service, one entry point: `python -m bench [SUBCOMMAND] [options]` (bench/README.md)."""
