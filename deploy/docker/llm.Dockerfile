# syntax=docker/dockerfile:1.7
# The thinker (python -m voice_llm.server). Build context: the repository root.
#   GPU (default): CUDA base + vLLM (VLLM_VERSION), LLM_BACKEND=vllm.
#   CPU (compose profile cpu): BASE_IMAGE=debian:bookworm-slim, VLLM_VERSION="", the
#   CPU torch, LLM_BACKEND=transformers.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04
ARG UV_VERSION=0.13.8

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

# --- build ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG VLLM_VERSION=0.33.0
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/venv
COPY --from=uv /uv /usr/local/bin/uv
RUN uv venv --python 3.11 /opt/venv
# vLLM pins the exact torch it was built against, so with vLLM it brings torch; without
# it, torch comes first, pinned, from the index matching the base.
RUN if [ -n "${VLLM_VERSION}" ]; then \
        uv pip install "vllm==${VLLM_VERSION}"; \
    else \
        uv pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; \
    fi
COPY proto /src/proto
COPY services/llm /src/services/llm
RUN uv pip install /src/proto /src/services/llm

# --- runtime -----------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin voice
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    LLM_GRPC_PORT=50052 \
    LLM_HTTP_PORT=8002
USER 10001
WORKDIR /home/voice
EXPOSE 50052 8002
# vLLM loads ~30 GB of weights and captures CUDA graphs before /healthz says ready.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "LLM_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_llm.server"]
