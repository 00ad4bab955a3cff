# syntax=docker/dockerfile:1.7
# The token service and web page (python -m voice_token). Build context: the repository
# root. HTTP only: no protos, no torch.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY services/token /src/services/token
RUN /opt/venv/bin/pip install /src/services/token

FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin voice
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
# TOKEN_HTTP_PORT is a port number, not a secret (hadolint matches the word TOKEN).
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    TOKEN_HTTP_PORT=8080
USER 10001
WORKDIR /home/voice
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "TOKEN_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_token"]
