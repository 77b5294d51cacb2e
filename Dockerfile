# syntax=docker/dockerfile:1
# sidestream: the sidecar (`sidestream`, the entrypoint) and the injector
# (`python -m sidecar.injector`, see k8s/injector). Built from the wheel, as users install
# it: the build stage, which has a C compiler, makes sidestream's wheel with the compiled core
# in it; the install stage, which has none, installs that wheel into a virtualenv; the final
# stage gets only that virtualenv: no compiler, no pip, no wheel files.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY middleware ./middleware
COPY sidecar ./sidecar
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS install
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Dependencies as wheels only (uvloop, httptools and friends ship manylinux wheels): a
# missing wheel fails the build here instead of silently needing a compiler. setup.py goes
# on without the compiled core where it cannot build it: the version line must name it.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/venv \
    && /opt/venv/bin/pip install --only-binary=:all: /wheels/sidestream-*.whl \
    && /opt/venv/bin/sidestream --version | grep -F "(compiled core)" \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
# The base image's own pip and setuptools are not needed at run time.
RUN python -m pip uninstall --yes pip setuptools wheel
COPY --from=install /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so the kubelet can check runAsNonRoot; matches runAsUser in k8s/.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9901
ENTRYPOINT ["sidestream"]
