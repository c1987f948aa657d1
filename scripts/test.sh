#!/usr/bin/env bash
# The full test suite: lint, types, then every test (unit, contract, integration against
# real brokers the fixtures start on loopback, chaos). Extra arguments go to pytest.
# `--fast` (make test-fast): pip extras only, no system packages, no brokers, no JVM; unit
# and contract tests.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --fast ]; then
  shift
  bash scripts/bootstrap.sh fast || exit 1
  set -- tests/unit tests/contract "$@"
else
  bash scripts/bootstrap.sh all || exit 1
fi

echo "== ruff"; python3 -m ruff check msgsafe tests benchmarks examples || exit 1
echo "== mypy --strict"; python3 -m mypy || exit 1
echo "== pytest"
python3 -m pytest -ra --durations=15 "$@"
rc=$?
# Exit 5 means no test was collected: that is a failure of the suite, not a pass.
[ $rc -eq 5 ] && { echo "no tests were collected"; exit 1; }
exit $rc
