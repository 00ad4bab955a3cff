# The TTS service (python -m voice_tts.server). Build context: the repository root (the
# root .dockerignore keeps it to proto/, services/ and deploy/). Any builder: no BuildKit
# features, and no image but the two bases below.
#   GPU (default): the CUDA build of torch from TORCH_INDEX_URL. Its wheels carry the CUDA
#     libraries (the driver comes from the NVIDIA Container Toolkit), so the base is a
#     plain Python image; gcc is there for Triton, which compiles its launchers at start.
#   CPU (compose profile cpu): TORCH_INDEX_URL=.../whl/cpu, APT_PACKAGES="".
# Empty TORCH_INDEX_URL: torch from the default index and deploy/docker/inputs/wheels/.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a venv in /opt/venv ---------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
COPY deploy/docker/inputs/ /tmp/build/
RUN sh /tmp/build/apply.sh && python3 -m venv /opt/venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/build/wheels \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PATH=/opt/venv/bin:${PATH}
# torch first, pinned, from the index that matches the build: resolved later as a plain
# dependency it would take whatever build PyPI serves.
RUN PIP_INDEX_URL="${TORCH_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}" \
    pip install "torch==${TORCH_VERSION}"
# Dependencies first, in their own layer (deps.py): a code change rebuilds only our packages.
COPY deploy/docker/deps.py /tmp/deps.py
COPY proto/pyproject.toml /src/proto/pyproject.toml
COPY libs/voice-keys/pyproject.toml /src/libs/voice-keys/pyproject.toml
COPY services/tts/pyproject.toml /src/services/tts/pyproject.toml
RUN python3 /tmp/deps.py /src/proto/pyproject.toml /src/libs/voice-keys/pyproject.toml /src/services/tts/pyproject.toml > /tmp/deps.txt && pip install -r /tmp/deps.txt
COPY proto /src/proto
COPY libs/voice-keys /src/libs/voice-keys
COPY services/tts /src/services/tts
RUN pip install --no-deps /src/proto /src/libs/voice-keys /src/services/tts

# --- runtime: no sources, no build inputs, a non-root user ----------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG APT_PACKAGES="gcc libc6-dev"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# /voices: the voice library's mount point (TTS_VOICE_DIR), owned by the app user: a
# fresh named volume mounted there takes its owner.
# Unpinned on purpose: the base image's Debian release pins them.
# hadolint ignore=DL3008
RUN if [ -n "${APT_PACKAGES}" ]; then \
        apt-get update && apt-get install -y --no-install-recommends ${APT_PACKAGES} \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin app \
    && install -d -o 10001 -g 10001 /voices
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    TTS_GRPC_PORT=50051 \
    TTS_HTTP_PORT=8001
USER 10001
WORKDIR /home/app
EXPOSE 50051 8001
# /healthz turns 200 only after warm-up (weights, CUDA graphs): a long start period.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "TTS_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_tts.server"]
