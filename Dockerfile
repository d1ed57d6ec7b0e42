# The image for Docker work pools and `docker compose run --rm mat ...`.
# Build: docker build -t multiagenttrainer .      Run: docker run --rm -v "$PWD:/work" multiagenttrainer sources
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends git openssh-client rsync gcc libc6-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/mat
COPY pyproject.toml setup.py README.md ./
COPY multiagenttrainer ./multiagenttrainer
COPY flows ./flows
COPY tasks ./tasks
COPY blocks ./blocks
COPY deployments ./deployments
COPY configs ./configs
COPY prefect.yaml ./

# CPU torch first, so the optional extras do not pull a CUDA build; GPU images can override TORCH_SPEC.
ARG TORCH_SPEC="torch==2.13.0"
ARG EXTRAS="aws,docker,ssh"
RUN pip install --no-cache-dir "$TORCH_SPEC" && pip install --no-cache-dir -e ".[$EXTRAS]"

ENV MAT_PROJECT_DIR=/opt/mat \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false
WORKDIR /work
ENTRYPOINT ["mat"]
CMD ["--help"]
