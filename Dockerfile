# syntax=docker/dockerfile:1
# sidestream: the sidecar (`sidestream`, the entrypoint) and the injector
# (`python -m sidecar.injector`, see k8s/injector). Two stages: the build stage installs
# into a virtualenv; the final stage gets only that virtualenv, no pip, no compilers.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY middleware ./middleware
COPY sidecar ./sidecar
# Dependencies as wheels only (uvloop, httptools and friends ship manylinux wheels): a
# missing wheel fails the build here instead of silently needing a compiler.
RUN /opt/venv/bin/pip install --only-binary=:all: . \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
# The base image's own pip and setuptools are not needed at run time.
RUN python -m pip uninstall --yes pip setuptools wheel
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so the kubelet can check runAsNonRoot; matches runAsUser in k8s/.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9901
ENTRYPOINT ["sidestream"]
