"""The second serving runtime: the same embedding.mar served without Java (``python -m serving.python_runtime``, see
:mod:`serving.python_runtime.cli`)."""
