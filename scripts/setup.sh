#!/usr/bin/env bash
# Sets up everything llft needs on a fresh machine of this kind (Debian, CPython 3.11):
# Java for Spark (if missing), a virtualenv in .venv, and an editable install of the
# package, which builds the preload shim (native/) and the cffi modules (the shared-memory
# block, the heartbeat thread, the wire codec's C half; OpenSSL's headers if missing).
# Idempotent: a second run only re-checks and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${LLFT_PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "setup: no python3 found; install CPython 3.11" >&2; exit 1; }

# Java: PySpark runs a JVM. Install a headless JRE from Debian if none is on PATH.
if ! command -v java >/dev/null 2>&1; then
  echo "setup: java not found, installing default-jre-headless" >&2
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
  else
    echo "setup: no java and no apt-get: install a Java 17+ runtime and re-run" >&2; exit 1
  fi
fi

# OpenSSL's headers: the wire codec's C half (native/wire/) takes SHA-256 from libcrypto,
# the library CPython's hashlib already loads.
if [ ! -f /usr/include/openssl/sha.h ]; then
  echo "setup: OpenSSL headers not found, installing libssl-dev" >&2
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev >/dev/null
  else
    echo "setup: no OpenSSL headers and no apt-get: install OpenSSL's development files and re-run" >&2; exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.llft-installed
# Re-install when setup.py or the native sources changed since the last install.
if [ ! -f "$stamp" ] || [ -n "$(find setup.py native -newer "$stamp" -print -quit 2>/dev/null)" ] \
   || ! .venv/bin/python -c 'import native._llft_shm, native._llft_pulse, native._llft_wire' >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch "$stamp"
fi

# Bytecode for llft's own modules. Where PYTHONDONTWRITEBYTECODE is set (as on this kind of
# machine), Python never writes it, and every agent, gateway and watchdog compiled ~15,000
# lines from source at its start: 0.55 s of CPU instead of 0.21 s for `import
# llft.runtime.agent` on a slow 2-core VM. Python still reads bytecode that exists, and
# checks it against its source's mtime; this pass only compiles what changed.
.venv/bin/python -m compileall -q -j 0 llft membership determinizer native examples >/dev/null
