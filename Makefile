.PHONY: demo test test-fast lint bench client-suites

demo:            ## install and run the demo of the promise (lost = 0)
	bash scripts/demo.sh

test:            ## install and run the full test suite against real brokers
	bash scripts/test.sh $(ARGS)

test-fast:       ## the inner loop: lint, types, unit and contract tests (no brokers, no JVM, < 3 min); ARGS=PATH... for some files
	bash scripts/test.sh --fast $(ARGS)

lint:
	python3 -m ruff check msgsafe tests benchmarks examples && python3 -m ruff format --check msgsafe tests benchmarks examples && python3 -m mypy && python3 -m mypy tests

bench:           ## run every benchmark and print ratios measured in one run
	bash scripts/bootstrap.sh all && for b in benchmarks/bench_*.py; do python3 "$$b"; done

client-suites:   ## the clients' own test suites, real client vs wrapper (checkouts: tests/thirdparty/README.md)
	python3 -m tests.thirdparty.client_suites --checkout pika=$(PIKA_CHECKOUT) --checkout confluent-kafka=$(CONFLUENT_KAFKA_CHECKOUT)
