#!/usr/bin/env bash
# The kafka-python drop-in under kafka-python 2.x: its unit tests, the differential tests
# (real kafka-python 2.x and the wrapper on the same Apache Kafka cluster) and the crash
# count, in a virtualenv that sees everything installed in .venv but kafka-python, which is
# the newest 2.x. The main suite runs with the kafka-python the compat extra installs (3.x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh all
venv=.venv-kafka-python-2
[ -x "$venv/bin/python" ] || .venv/bin/python -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q 'kafka-python>=2.3,<3'
"$venv/bin/python" -c 'import kafka; print("kafka-python", kafka.__version__)'
exec "$venv/bin/python" -m pytest -ra \
  tests/unit/test_compat_kafka_python.py \
  tests/integration/compat/test_differential_kafka_python.py \
  tests/integration/compat/test_crash_kafka_python.py "$@"
