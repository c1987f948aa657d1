#!/usr/bin/env bash
# The demo: installs msgsafe and runs `msgsafe demo` (an embedded Kafka-protocol broker is
# started, killed mid-run and restarted; the report shows lost = 0). Arguments go to it:
# `--cluster kafka` runs the same story on three Apache Kafka nodes instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh demo
. scripts/venv.sh
exec python3 -m msgsafe demo "$@"
