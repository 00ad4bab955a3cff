# The LiveKit agent (python -m voice_agent). Build context: the repository root (the root
# .dockerignore keeps it to proto/, services/ and deploy/). Any builder.
# No torch: the VAD is Silero's ONNX model shipped inside livekit-plugins-silero.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
COPY deploy/docker/inputs/ /tmp/build/
RUN sh /tmp/build/apply.sh && python3 -m venv /opt/venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/build/wheels \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PATH=/opt/venv/bin:${PATH}
# Dependencies first, in their own layer (deps.py): a code change rebuilds only our packages.
COPY deploy/docker/deps.py /tmp/deps.py
COPY proto/pyproject.toml /src/proto/pyproject.toml
COPY libs/voice-keys/pyproject.toml /src/libs/voice-keys/pyproject.toml
COPY services/agent/pyproject.toml /src/services/agent/pyproject.toml
RUN python3 /tmp/deps.py /src/proto/pyproject.toml /src/libs/voice-keys/pyproject.toml /src/services/agent/pyproject.toml > /tmp/deps.txt && pip install -r /tmp/deps.txt
# Smart Turn v3.2's ONNX file at the venv's default place (/opt/venv/share/voice-agent/):
# the host's copy when the build inputs have it (`make up` puts .venv/agent's there), else
# from the pinned pipecat-ai wheel through pip (find-links first). Its own layer, kept
# until smart_turn.py or the inputs change.
COPY services/agent/src/voice_agent/smart_turn.py /tmp/smart_turn.py
RUN python3 /tmp/smart_turn.py fetch --source /tmp/build/smart-turn/smart-turn-v3.2-cpu.onnx
COPY proto /src/proto
COPY libs/voice-keys /src/libs/voice-keys
COPY services/agent /src/services/agent
RUN pip install --no-deps /src/proto /src/libs/voice-keys /src/services/agent

FROM ${PYTHON_IMAGE} AS runtime
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# Not "voice": Debian already has a system group of that name (audio devices).
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    AGENT_HTTP_PORT=8003
USER 10001
WORKDIR /home/app
EXPOSE 8003
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "AGENT_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_agent"]
