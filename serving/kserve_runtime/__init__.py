"""The serving image's runtime: TorchServe on loopback behind the KServe-protocol gateway (``python -m
serving.kserve_runtime``, see :mod:`serving.kserve_runtime.cli`)."""
