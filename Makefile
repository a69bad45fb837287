# One entry point for people and CI alike; each target is a script under scripts/.
.PHONY: setup demo test test-faults bench clean

setup:        ## install what is missing (apt packages, .venv, editable packages, emulator)
	@scripts/setup.sh

demo: setup   ## the main job: local stack + lab campaign + dashboard
	@scripts/demo.sh

test: setup   ## the whole test suite against real PostgreSQL, Redis, Celery, namespaces, Chromium
	@scripts/test.sh

test-faults: setup  ## fault-injection suite (long)
	@scripts/test.sh -m faults

bench: setup  ## benchmarks (run by hand; results go to bench/results/)
	@scripts/bench.sh

clean:        ## stop the demo stack and the local services, tear down lab leftovers
	-@.venv/bin/iwscope lab stack stop 2>/dev/null
	-@.venv/bin/iwscope lab cleanup 2>/dev/null
	-@.venv/bin/iwscope services stop 2>/dev/null
