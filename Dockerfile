# syntax=docker/dockerfile:1
# sidestream: the sidecar (`sidestream`, the entrypoint) and the injector
# (`python -m sidecar.injector`, see k8s/injector). Built from the wheel, as users install
# it: the build stage, which has a C compiler, makes sidestream's wheel with the compiled core
# in it; the install stage, which has none, installs that wheel into a virtualenv; the final
# stage gets only that virtualenv: no compiler, no pip, no wheel files. The dependencies are
# the ones deploy/image.lock pins (`make lock`), installed by deploy/image-install.sh.
#
# The base, by tag until it is pinned by digest (python:3.11-slim-bookworm@sha256:...), so
# that a rebuild starts from the same layers. Its Python stays 3.11, the one
# tests/system/test_image_install.py installs the lock on.
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
# The locked dependencies (hash-checked wheels only), then the wheel without dependencies;
# fails unless `pip check` passes and the version line names the compiled core.
COPY deploy/image.lock deploy/image-install.sh /deploy/
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    sh /deploy/image-install.sh /opt/venv /wheels

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
