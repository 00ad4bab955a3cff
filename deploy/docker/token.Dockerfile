# syntax=docker/dockerfile:1.7
# The token service and web page (python -m voice_token). Build context: the repository
# root. HTTP only: no protos, no torch. The page's JS bundle (livekit-client + our
# src/*.js, esbuild) is built in a node stage by the service's own web/build.sh.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

FROM ${NODE_IMAGE} AS web
WORKDIR /src/services/token/web
# Lock file first: `npm ci` is cached until the dependencies change.
COPY services/token/web/package.json services/token/web/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY services/token/web/ ./
RUN mkdir -p ../src/voice_token/static && bash build.sh

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY services/token /src/services/token
COPY --from=web /src/services/token/src/voice_token/static/dist /src/services/token/src/voice_token/static/dist
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
