# One image for every Kubeflow pipeline task: Python 3.11, Java 17 (TorchServe), CPU-only torch,
# the pinned dependencies of requirements.lock and the project on PYTHONPATH.
#   docker build -t REGISTRY/mnist-embedding:TAG .
#   PIPELINE_IMAGE=REGISTRY/mnist-embedding:TAG python -m pipeline compile
# bookworm, not the newer default trixie base: trixie has no openjdk-17.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1

WORKDIR /opt/mnist-embedding
COPY requirements.lock .
# torch from the CPU-only index first (its default Linux wheel pulls GBs of CUDA libraries); the
# lock's torch==X then is already satisfied by X+cpu, and everything else comes pinned from PyPI.
RUN pip install --no-deps --index-url https://download.pytorch.org/whl/cpu "$(grep '^torch==' requirements.lock)" \
 && pip install -r requirements.lock

COPY . .
ENV PYTHONPATH=/opt/mnist-embedding

RUN useradd --create-home --uid 10001 app
USER 10001
WORKDIR /home/app
