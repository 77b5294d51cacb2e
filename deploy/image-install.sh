#!/bin/sh
# The container image's install, in one place: the Dockerfile's install stage runs it, and so
# does tests/system/test_image_install.py where no image builder runs.
#
#   sh deploy/image-install.sh VENV WHEEL_DIR
#
# Makes a virtualenv at VENV with the interpreter $PYTHON (python3 by default) and installs
# exactly what deploy/image.lock pins, each file checked against its hash, as wheels only: a
# dependency without a wheel for this platform fails here instead of needing a compiler.
# Then sidestream's wheel from WHEEL_DIR without dependencies, so nothing unpinned comes in.
set -eu
venv=$1
wheels=$2
lock=$(dirname "$0")/image.lock

"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install --require-hashes --only-binary=:all: -r "$lock"
"$venv/bin/pip" install --no-deps --no-index "$wheels"/sidestream-*.whl
"$venv/bin/pip" check
# setup.py goes on without the compiled core where it cannot build it: the version line must
# name it, or the image would silently run the interpreted one.
version=$("$venv/bin/sidestream" --version)
echo "$version"
case $version in
*"(compiled core)"*) ;;
*) echo "image-install.sh: the compiled core is not built or does not import" >&2; exit 1 ;;
esac
# Not needed at run time: the final stage gets this venv without them.
"$venv/bin/pip" uninstall --yes pip setuptools
