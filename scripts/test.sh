#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest.
# Under CI (CI=true) the slow campaigns (soaks, chaos, big transfers) also run, at a
# small size (--soak=small); run them at full size with: scripts/test.sh --soak=full
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
args=()
if [ "${CI:-}" = "true" ] && [[ " $* " != *" --soak"* ]]; then args+=(--soak=small); fi
.venv/bin/python -m pytest "${args[@]}" "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "test.sh: pytest collected no tests: failing on purpose" >&2; exit 1; fi
exit $rc
