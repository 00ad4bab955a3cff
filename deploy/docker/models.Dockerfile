# The model-download job: fills the `models` volume once (deploy/models/download.py).
# Build context: the repository root. Any builder.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG HF_HUB_VERSION=">=0.34,<3"
COPY deploy/docker/inputs/ /tmp/build/
RUN sh /tmp/build/apply.sh && python3 -m venv /opt/venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/build/wheels \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN /opt/venv/bin/pip install "huggingface_hub[hf_xet]${HF_HUB_VERSION}"

FROM ${PYTHON_IMAGE} AS runtime
# The build's trust bundle (with any extra CA): the job downloads over HTTPS.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# A named volume mounted on /models for the first time takes this owner: the job can write.
# Not "voice": Debian already has a system group of that name (audio devices).
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin app \
    && mkdir -p /models && chown 10001:10001 /models
COPY --from=build /opt/venv /opt/venv
COPY deploy/models/download.py /opt/voice/download.py
ENV PATH=/opt/venv/bin:${PATH} PYTHONUNBUFFERED=1 MODELS_DIR=/models \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001
# A one-shot job: nothing to probe.
HEALTHCHECK NONE
ENTRYPOINT ["python", "/opt/voice/download.py"]
