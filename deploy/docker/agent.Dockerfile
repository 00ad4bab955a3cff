# syntax=docker/dockerfile:1.7
# The LiveKit agent (python -m voice_agent). Build context: the repository root.
# No torch: the VAD is Silero's ONNX model shipped inside livekit-plugins-silero.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY proto /src/proto
COPY services/agent /src/services/agent
RUN /opt/venv/bin/pip install /src/proto /src/services/agent

FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin voice
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    AGENT_HTTP_PORT=8003
USER 10001
WORKDIR /home/voice
EXPOSE 8003
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "AGENT_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_agent"]
