"""Side-by-side performance benchmark of the embedding service: `python -m bench --out bench/results [--quick]`."""
