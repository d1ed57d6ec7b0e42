# The image for `docker compose run --rm mat ...` and for Docker work pools: mat in a virtualenv, run as
# the non-root user `mat`, with `mat` as the entrypoint.
#
#   docker build -t multiagenttrainer .                          # CPU torch, extras opensource,aws,docker,ssh
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 -t multiagenttrainer:cuda .
#   docker run --rm -v "$PWD:/work" multiagenttrainer sources
#
# Build arguments:
#   BASE_IMAGE        a Debian-like image with Python 3.11+ (python:3.11-slim)
#   EXTRAS            mat's extras (opensource brings torch and the open-source fine-tuning stack)
#   TORCH             the torch requirement installed first, from TORCH_INDEX_URL; empty: no torch
#   TORCH_INDEX_URL   where torch comes from: the CPU build by default, a CUDA index (…/whl/cu124) for GPUs
#   PIP_OPTIONS       extra pip options, e.g. "--no-index --find-links /src/wheelhouse" for an offline build
#   BUILD_PACKAGES    Debian packages for the build stage (a C compiler for mat's native corpus accelerators)
#   SYSTEM_PACKAGES   Debian packages for the image (git for local repositories, ssh for ssh machines);
#                     empty when BASE_IMAGE already has them or has no apt-get
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG BUILD_PACKAGES="gcc libc6-dev libssl-dev"
RUN if [ -n "$BUILD_PACKAGES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $BUILD_PACKAGES && rm -rf /var/lib/apt/lists/*; \
    fi
COPY . /src
ARG TORCH="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG EXTRAS="opensource,aws,docker,ssh"
ARG PIP_OPTIONS=""
# torch first and from its own index, so that the extras find it installed and never pull another build.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --quiet --no-cache-dir $PIP_OPTIONS --upgrade pip \
    && if [ -n "$TORCH" ]; then \
         /opt/venv/bin/pip install --quiet --no-cache-dir $PIP_OPTIONS --index-url "$TORCH_INDEX_URL" \
           --extra-index-url https://pypi.org/simple "$TORCH"; \
       fi \
    && /opt/venv/bin/pip install --quiet --no-cache-dir $PIP_OPTIONS "/src${EXTRAS:+[$EXTRAS]}"

FROM ${BASE_IMAGE}
ARG SYSTEM_PACKAGES="git openssh-client"
RUN if [ -n "$SYSTEM_PACKAGES" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $SYSTEM_PACKAGES && rm -rf /var/lib/apt/lists/*; \
    fi \
    && echo "mat:x:1000:1000:mat:/home/mat:/bin/sh" >> /etc/passwd \
    && echo "mat:x:1000:" >> /etc/group \
    && mkdir -p /home/mat /work /repos \
    && chown 1000:1000 /home/mat /work
COPY --from=build /opt/venv /opt/venv
# prefect.yaml's deployments start in MAT_PROJECT_DIR and name their flows by file (flows/train.py).
COPY prefect.yaml /opt/mat/
COPY flows /opt/mat/flows
COPY configs /opt/mat/configs
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/mat \
    MAT_PROJECT_DIR=/opt/mat \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false
USER mat
WORKDIR /work
ENTRYPOINT ["mat"]
CMD ["--help"]
