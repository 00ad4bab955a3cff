# syntax=docker/dockerfile:1.7
# The TTS service (python -m voice_tts.server). Build context: the repository root.
#   GPU (default): BASE_IMAGE=nvidia/cuda:*-runtime, TORCH_INDEX_URL=.../whl/cu128
#   CPU (compose profile cpu): BASE_IMAGE=debian:bookworm-slim, TORCH_INDEX_URL=.../whl/cpu
# Python comes from uv (a standalone CPython 3.11), so one file serves both bases.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04
ARG UV_VERSION=0.13.8

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

# --- build: a venv in /opt/venv over a CPython in /opt/python --------------------------
FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/venv
COPY --from=uv /uv /usr/local/bin/uv
RUN uv venv --python 3.11 /opt/venv
# torch first, pinned, from the index that matches the base: resolved later as a plain
# dependency it would take whatever build PyPI serves.
RUN uv pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY proto /src/proto
COPY services/tts /src/services/tts
RUN uv pip install /src/proto /src/services/tts

# --- runtime: no uv, no sources, a non-root user ---------------------------------------
FROM ${BASE_IMAGE} AS runtime
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin voice
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    TTS_GRPC_PORT=50051 \
    TTS_HTTP_PORT=8001
USER 10001
WORKDIR /home/voice
EXPOSE 50051 8001
# /healthz turns 200 only after warm-up (weights, CUDA graphs): a long start period.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "TTS_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_tts.server"]
