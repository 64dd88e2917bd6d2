# The PIPELINE COMPONENT image: every Kubeflow task of the pipeline runs in it. Python 3.11 and Java 17
# (a task packs the .mar with torch-model-archiver and smoke-tests it on a local TorchServe), g++ (the train
# task compiles the int8 model ahead of time: training/quantize.py; the serving images need none), CPU torch,
# exactly the pins of requirements/product.lock, and the project's packages on PYTHONPATH. Nothing is
# pip-installed when a task starts (components use install_kfp_package=False, packages_to_install=[]).
#   scripts/build-images.sh --only pipeline [--push REGISTRY/PREFIX]   # content-hash tag; see --help
#   docker build -t REGISTRY/mnist-embedding-pipeline:TAG .
#   PIPELINE_IMAGE=REGISTRY/mnist-embedding-pipeline:TAG python -m pipeline compile
# CPU torch comes from PyTorch's CPU index by default; --build-arg TORCH_INDEX_URL=... picks another
# (e.g. https://download.pytorch.org/whl/cu126 for CUDA: its nvidia-* libraries come from PyPI).
# bookworm, not trixie: trixie has no openjdk-17.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates python3 python3-venv openjdk-17-jre-headless g++ \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

# Non-root. /gcs, /minio and /s3 are where KFP's launcher puts artifacts: KFP backends before 2.3 do
# not mount writable volumes there, so they exist here, writable by the task's user (and by group 0,
# for clusters that pick an arbitrary uid). Backends before 2.0.2 create them unusable for non-root
# users whatever the image does; `python -m pipeline submit` refuses those (pipeline/images.py).
RUN useradd --create-home --home-dir /home/app --uid 10001 --gid 0 --shell /bin/bash app \
 && mkdir -p /gcs /minio /s3 \
 && chown 10001:0 /gcs /minio /s3 /home/app \
 && chmod 775 /gcs /minio /s3 /home/app

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies before sources, so a source change rebuilds only the COPY layers below.
# TORCH_INDEX_URL: an extra index holding torch builds (''= none); pip takes the highest version that
# matches the lock's torch==X, i.e. X+cpu over PyPI's default X.
# PIP_FIND_LINKS / PIP_CERT: read by pip from the environment; empty by default (the build script sets
# them on machines with a local wheel directory or a TLS-intercepting proxy).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
COPY requirements/product.lock /opt/mnist-embedding/requirements/product.lock
RUN python3 -m venv /opt/venv \
 && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      -r /opt/mnist-embedding/requirements/product.lock \
 && pip check

ENV PYTHONPATH=/opt/mnist-embedding \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1 \
    HOME=/home/app

LABEL org.opencontainers.image.title="mnist-embedding-pipeline" \
      org.opencontainers.image.description="Kubeflow pipeline component image for the MNIST embedding model: training, FAISS gallery, TorchServe archive, KServe deployment (CPU torch by default)"

COPY config.properties model-config.yaml settings.py cli_common.py owned_paths.py /opt/mnist-embedding/
COPY training/ /opt/mnist-embedding/training/
COPY handler/ /opt/mnist-embedding/handler/
COPY serving/ /opt/mnist-embedding/serving/
COPY pipeline/ /opt/mnist-embedding/pipeline/
# pipeline.manifests validates every manifest the deploy task writes against these schemas.
COPY deploy/schemas/ /opt/mnist-embedding/deploy/schemas/

USER 10001:0
WORKDIR /home/app
