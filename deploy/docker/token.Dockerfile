# The token service and web page (python -m voice_token). Build context: the repository
# root (the root .dockerignore keeps it to proto/, services/ and deploy/). Any builder.
# HTTP only: no protos, no torch. The page's JS bundle (livekit-client + our src/*.js,
# esbuild) is built in a Node stage by the service's own web/build.sh.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

FROM ${NODE_IMAGE} AS web
COPY deploy/docker/inputs/ /tmp/build/
RUN sh /tmp/build/apply.sh
ENV NODE_EXTRA_CA_CERTS=/tmp/build/extra-ca.pem
WORKDIR /src/services/token/web
# Lock file first: `npm ci` is cached until the dependencies change.
COPY services/token/web/package.json services/token/web/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY services/token/web/ ./
# the /v1/talk protocol the page imports (web/src/talk.js): the agent's, described once
COPY services/agent/src/voice_agent/talk/protocol.json /src/services/agent/src/voice_agent/talk/protocol.json
RUN mkdir -p ../src/voice_token/static && bash build.sh

FROM ${PYTHON_IMAGE} AS build
COPY deploy/docker/inputs/ /tmp/build/
RUN sh /tmp/build/apply.sh && python3 -m venv /opt/venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/build/wheels \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PATH=/opt/venv/bin:${PATH}
# Dependencies first, in their own layer (deps.py): a code change rebuilds only our packages.
COPY deploy/docker/deps.py /tmp/deps.py
COPY libs/voice-keys/pyproject.toml /src/libs/voice-keys/pyproject.toml
COPY services/token/pyproject.toml /src/services/token/pyproject.toml
RUN python3 /tmp/deps.py /src/libs/voice-keys/pyproject.toml /src/services/token/pyproject.toml > /tmp/deps.txt && pip install -r /tmp/deps.txt
COPY services/token /src/services/token
COPY --from=web /src/services/token/src/voice_token/static/dist /src/services/token/src/voice_token/static/dist
COPY libs/voice-keys /src/libs/voice-keys
RUN pip install --no-deps /src/libs/voice-keys /src/services/token

FROM ${PYTHON_IMAGE} AS runtime
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# Not "voice": Debian already has a system group of that name (audio devices).
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
# TOKEN_HTTP_PORT is a port number, not a secret (hadolint matches the word TOKEN).
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    TOKEN_HTTP_PORT=8080
USER 10001
WORKDIR /home/app
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "TOKEN_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_token"]
