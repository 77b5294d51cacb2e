#!/usr/bin/env bash
# The programs the test suite runs that pip cannot install (`make test-deps` runs this first).
# Installs the missing ones in one apt-get step on Debian or Ubuntu, as root or with
# passwordless sudo. Where it cannot, it stops at once with one line naming the packages and
# the command (`sudo apt-get install ...`; without apt-get, Debian's names for them).
# Silent, and done in milliseconds, when everything is there.
# kubectl is not here: Debian's own (kubernetes-client 1.20) has no kustomize components,
# so the `system` extra brings a current one into .venv (tests/support/tools.py finds it).
set -euo pipefail

# program       Debian package  who runs it
table='
gcc             gcc             the compiled core, llama.cpp (the llamacpp extra)
g++             g++             llama.cpp
curl            curl            tests/system/test_clients.py, test_http2_cli.py
h2load          nghttp2-client  tests/system/test_http2_cli.py
nginx           nginx           tests/system/test_edge_nginx.py, test_probe_nginx.py
chromium        chromium        tests/system/test_*_browser.py
redis-server    redis-server    the Redis resume store (tests/sockets, tests/system)
prometheus      prometheus      tests/system/test_prometheus.py (promtool too)
valgrind        valgrind        tests/system/test_bench_callgrind.py
'

# Debian puts nginx in /usr/sbin, not on a user's PATH (tools.py looks there too).
have() { PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v "$1" >/dev/null 2>&1; }
have_chromium() { have chromium || have chromium-browser || have google-chrome; }

missing=()
while read -r program package _; do
  [ -n "$program" ] || continue
  case $program in chromium) have_chromium && continue ;; *) have "$program" && continue ;; esac
  missing+=("$package")
done <<<"$table"

# The compiled core needs the Python headers, and `make install` needs venv: Debian splits
# both out of its own python3.
python=${PYTHON:-python3}
if [[ "$(command -v "$python")" == /usr/bin/* ]] && have apt-get; then
  "$python" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
  "$python" -c 'import os, sysconfig; os.stat(sysconfig.get_path("include") + "/Python.h")' \
    2>/dev/null || missing+=(python3-dev)
fi

[ ${#missing[@]} -eq 0 ] && exit 0

if ! have apt-get; then
  echo "make test-deps: the tests need these programs (Debian's package names): ${missing[*]}; install them with this system's package manager, then run make test again" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then
  echo "make test-deps: the tests need ${missing[*]}: run \`sudo apt-get install -y ${missing[*]}\`, then make test again" >&2
  exit 1
fi
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
echo "make test-deps: apt-get install ${missing[*]} (programs the tests run)"
log=$(mktemp -t sidestream-apt.XXXXXX)
export DEBIAN_FRONTEND=noninteractive
if $sudo apt-get update -qq >"$log" 2>&1 &&
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
  rm -f "$log"
  exit 0
fi
echo "make test-deps: apt-get install failed; its output is in $log" >&2
exit 1
