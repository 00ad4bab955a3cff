# The thinker (python -m voice_llm.server). Build context: the repository root (the root
# .dockerignore keeps it to proto/, services/ and deploy/). Any builder.
#   GPU (default): vLLM (VLLM_VERSION) from PyPI, which brings the CUDA torch it was built
#     against (CUDA libraries inside the wheels); gcc for Triton. LLM_BACKEND=vllm.
#   CPU (compose profile cpu): VLLM_VERSION="", the CPU torch from TORCH_INDEX_URL,
#     APT_PACKAGES="", LLM_BACKEND=transformers.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG VLLM_VERSION=0.33.0
COPY deploy/docker/inputs/ /tmp/build/
RUN sh /tmp/build/apply.sh && python3 -m venv /opt/venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/build/wheels \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt PATH=/opt/venv/bin:${PATH}
# vLLM pins the exact torch it was built against, so with vLLM it brings torch; without
# it, torch comes first, pinned, from the index matching the build.
RUN if [ -n "${VLLM_VERSION}" ]; then \
        pip install "vllm==${VLLM_VERSION}"; \
    else \
        PIP_INDEX_URL="${TORCH_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}" \
        pip install "torch==${TORCH_VERSION}"; \
    fi
# Dependencies first, in their own layer (deps.py): a code change rebuilds only our packages.
COPY deploy/docker/deps.py /tmp/deps.py
COPY proto/pyproject.toml /src/proto/pyproject.toml
COPY libs/voice-keys/pyproject.toml /src/libs/voice-keys/pyproject.toml
COPY services/llm/pyproject.toml /src/services/llm/pyproject.toml
RUN python3 /tmp/deps.py /src/proto/pyproject.toml /src/libs/voice-keys/pyproject.toml /src/services/llm/pyproject.toml > /tmp/deps.txt && pip install -r /tmp/deps.txt
COPY proto /src/proto
COPY libs/voice-keys /src/libs/voice-keys
COPY services/llm /src/services/llm
RUN pip install --no-deps /src/proto /src/libs/voice-keys /src/services/llm

# --- runtime -----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG APT_PACKAGES="gcc libc6-dev"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# Unpinned on purpose: the base image's Debian release pins them.
# hadolint ignore=DL3008
RUN if [ -n "${APT_PACKAGES}" ]; then \
        apt-get update && apt-get install -y --no-install-recommends ${APT_PACKAGES} \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/voice/healthcheck.py
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    LLM_GRPC_PORT=50052 \
    LLM_HTTP_PORT=8002
USER 10001
WORKDIR /home/app
EXPOSE 50052 8002
# vLLM loads ~30 GB of weights and captures CUDA graphs before /healthz says ready.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/opt/voice/healthcheck.py", "LLM_HTTP_PORT"]
ENTRYPOINT ["python", "-m", "voice_llm.server"]
