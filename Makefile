.PHONY: demo test test-fast test-kafka-python-2 lint docs docs-serve bench client-suites

demo:            ## install and run the demo of the promise (lost = 0)
	bash scripts/demo.sh

test:            ## install and run the full test suite against real brokers
	bash scripts/test.sh $(ARGS)

test-fast:       ## the inner loop: lint, types, unit and contract tests (no brokers, no JVM, < 3 min); ARGS=PATH... for some files
	bash scripts/test.sh --fast $(ARGS)

test-kafka-python-2:  ## the kafka-python drop-in's unit, differential and crash tests under kafka-python 2.x (a venv)
	bash scripts/test_kafka_python_2.sh $(ARGS)

PY = .venv/bin/python

lint:            ## ruff, ruff format --check, mypy --strict (in .venv: make test-fast makes it)
	$(PY) -m ruff check msgsafe tests benchmarks examples && $(PY) -m ruff format --check msgsafe tests benchmarks examples && $(PY) -m mypy && $(PY) -m mypy tests

docs:            ## build the documentation site strictly into site/ (a broken link, a missing page, a docstring that does not render: fails)
	bash scripts/bootstrap.sh docs && NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve:      ## serve the documentation site at http://127.0.0.1:8000, rebuilt on every change
	bash scripts/bootstrap.sh docs && NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

bench:           ## run every benchmark and print ratios measured in one run
	bash scripts/bootstrap.sh all && for b in benchmarks/bench_*.py; do $(PY) "$$b"; done

# Each client whose checkout is given runs (at least one): NAME_CHECKOUT=DIR, e.g.
# make client-suites PIKA_CHECKOUT=../pika KAFKA_PYTHON_CHECKOUT=../kafka-python
SUITE_CHECKOUTS = pika=$(PIKA_CHECKOUT) confluent-kafka=$(CONFLUENT_KAFKA_CHECKOUT) \
	kafka-python=$(KAFKA_PYTHON_CHECKOUT) aiokafka=$(AIOKAFKA_CHECKOUT) celery=$(CELERY_CHECKOUT) \
	kombu=$(KOMBU_CHECKOUT) aio-pika=$(AIO_PIKA_CHECKOUT) proton=$(PROTON_CHECKOUT)

client-suites:   ## the clients' own test suites, real client vs wrapper (checkouts: tests/thirdparty/README.md)
	$(PY) -m tests.thirdparty.client_suites $(foreach c,$(SUITE_CHECKOUTS),$(if $(word 2,$(subst =, ,$(c))),--checkout $(c)))
