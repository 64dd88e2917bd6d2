"""Kubeflow Pipelines (v2) definition of the build: components, pipeline, deploy targets and CLI."""
