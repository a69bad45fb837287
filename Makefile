# One entry point for people and CI alike; each target is a script under scripts/.
.PHONY: setup lock lint demo test test-unit test-slow test-faults bench clean fresh-check deploy-check

setup:        ## install what is missing (apt packages, .venv from requirements.lock, editable packages, emulator)
	@scripts/setup.sh

lock:         ## add new requirements to requirements.lock (versions + hashes), keeping the pins; UPGRADE=1 re-resolves all
	@scripts/lock.sh

lint: setup   ## ruff check + ruff format --check over the repository, mypy --strict over probe/, collector/, dashboard/ and lab/ (CI runs it)
	@scripts/lint.sh

demo: setup   ## the main job: local stack + lab campaign + dashboard
	@scripts/demo.sh

test: setup   ## every test but those marked faults and slow, against real PostgreSQL, Redis, Celery, namespaces, Chromium
	@scripts/test.sh

test-unit:    ## the fast tier: pure-code tests, no root, no services, under a minute (uses the .venv of setup)
	@scripts/test-unit.sh

test-slow: setup  ## the rehearsals marked slow (the lab IW grid, the paired intervals' coverage, the full fuzz, the cost and fairness lab runs, ...; README), run by hand
	@scripts/test.sh -m slow

test-faults: setup  ## fault-injection suite (long)
	@scripts/test.sh -m faults

bench: setup  ## benchmarks (run by hand; results go to bench/results/)
	@scripts/bench.sh

deploy-check: setup  ## as root: the images built by podman, the chart played and upgraded by it, older probe builds, probes and an origin on qemu VMs, the Ansible role on this host (docs/deployment.md; ~19 min with its images cached)
	@scripts/test.sh -m deploy

fresh-check:  ## .ci/run in a fresh Debian 12 chroot with the checkout in a 0700 /root (about 30 min)
	@scripts/fresh-machine-check.sh

clean:        ## stop the demo stack and the local services, tear down lab leftovers
	-@.venv/bin/iwscope lab stack stop 2>/dev/null
	-@.venv/bin/iwscope lab cleanup 2>/dev/null
	-@.venv/bin/iwscope services stop 2>/dev/null
	-@.venv/bin/python -c 'from iwscope_lab.service_address import remove; remove()' 2>/dev/null
