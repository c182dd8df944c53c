# syntax=docker/dockerfile:1
# One slim, non-root image for the DynamICCL services: collector, detector, retuner, the example alert
# webhook and (compose --profile demo) the simulated training job. The C plugins are compiled in the build
# stage; the runtime stage has no compiler.
#   docker build -t dynamiccl .                      # or: docker compose build
#   docker build --build-arg EXTRAS=services,report,autoencoder .  # + torch for the autoencoder (large)
# The base wheel pulls no third-party package (a training node needs none): the services need the
# `services` extra and `dynamiccl report` the `report` extra, so both are the default here.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# builds dynamiccl/nccl_profiler_plugin/*.so through hatch_build.py and ships them in the wheel
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim
ARG EXTRAS="services,report"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 10001 dynamiccl \
 && useradd --uid 10001 --gid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin dynamiccl \
 && mkdir -p /data/parquet /data/tuner /data/sim /run/dynamiccl \
 && chown -R 10001:10001 /data /run/dynamiccl
COPY --from=build /wheels /wheels
# deploy/constraints-services.txt pins the extras' third-party packages to exact versions, so the image is
# reproducible; it is a constraint file (-c), the package itself keeps its ranges. An extra it does not
# list (autoencoder's torch) resolves unpinned.
COPY deploy/constraints-services.txt /tmp/constraints.txt
RUN whl="$(ls /wheels/dynamiccl-*.whl)" \
 && pip install -c /tmp/constraints.txt "${whl}${EXTRAS:+[${EXTRAS}]}" \
 && rm -rf /wheels /tmp/constraints.txt
USER 10001:10001
WORKDIR /data
# collector /metrics, features, plugin stream; detector /metrics, changes; retuner /metrics; alert webhook
EXPOSE 9464 9465 9470 9466 9467 9468 9469
ENTRYPOINT ["dynamiccl"]
CMD ["--help"]
