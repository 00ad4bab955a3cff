# syntax=docker/dockerfile:1.7
# The model-download job: fills the `models` volume once (deploy/models/download.py).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG HF_HUB_VERSION=">=0.34,<3"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv && /opt/venv/bin/pip install "huggingface_hub[hf_xet]${HF_HUB_VERSION}"

FROM ${PYTHON_IMAGE} AS runtime
# A named volume mounted on /models for the first time takes this owner: the job can write.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin voice \
    && mkdir -p /models && chown 10001:10001 /models
COPY --from=build /opt/venv /opt/venv
COPY deploy/models/download.py /opt/voice/download.py
ENV PATH=/opt/venv/bin:${PATH} PYTHONUNBUFFERED=1 MODELS_DIR=/models
USER 10001
# A one-shot job: nothing to probe.
HEALTHCHECK NONE
ENTRYPOINT ["python", "/opt/voice/download.py"]
