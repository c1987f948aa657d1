#!/usr/bin/env bash
# The kafka-python drop-in under kafka-python 2.x: its unit tests, the differential tests
# (real kafka-python 2.x and the wrapper on the same Apache Kafka cluster) and the crash
# count, in a virtualenv that sees everything installed in .venv but kafka-python, which is
# the newest 2.x. The main suite runs with the kafka-python the compat extra installs (3.x).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stop_started.sh
bash scripts/bootstrap.sh all
venv=.venv-kafka-python-2
[ -x "$venv/bin/python" ] || .venv/bin/python -m venv "$venv"
# A venv made from .venv's python sees the base interpreter's packages, not .venv's:
# add .venv's site-packages (and the .pth files there, msgsafe's editable install
# among them) after the new venv's own, so its kafka-python 2.x comes first.
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
main_site="$(.venv/bin/python -c "$purelib")"
own_site="$("$venv/bin/python" -c "$purelib")"
printf 'import site; site.addsitedir(%s)\n' "'$main_site'" >"$own_site/msgsafe-main-venv.pth"
"$venv/bin/python" -m pip install -q 'kafka-python>=2.3,<3'
"$venv/bin/python" -c 'import kafka; print("kafka-python", kafka.__version__)'
"$venv/bin/python" -m pytest -ra \
  tests/unit/compat/test_kafka_python.py \
  tests/integration/compat/test_differential_kafka_python.py \
  tests/integration/compat/test_crash_kafka_python.py "$@"
