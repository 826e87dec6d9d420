#!/usr/bin/env bash
# Fuzzes the GGUF reader for SECONDS, then the safetensors reader, the chat-template interpreter, the
# tokenizer.json reader, the config.json reader, the CPU sampler and the OpenAI request path for half
# that each: scripts/fuzz.sh [SECONDS] (default 60).
#
# Builds the targets of tests/fuzz with clang in their own folder (build-fuzz), with all of
# kiln_core compiled under ASan+UBSan and libFuzzer's coverage instrumentation so the code under
# test is explored, then runs libFuzzer on each from its seeds. Exits nonzero when a fuzzer finds a
# crash, undefined behaviour, an exception other than kiln::Error, a leak, a slow input or a single
# allocation over 256 MB (a reader must never allocate much more than its input); the input that
# did it is left in build-fuzz/artifacts/ (reproduce: build-fuzz/tests/fuzz/TARGET FILE).
# Needs no network. Environment: CXX_FUZZ (clang++), KILN_FUZZ_BUILD (folder), KILN_FUZZ_JOBS (2).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KILN_FUZZ_BUILD:-$root/build-fuzz}"
jobs="${KILN_FUZZ_JOBS:-2}"
cxx="${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}"
[[ -n "$cxx" ]] || { echo "fuzz.sh: clang++ not found (libFuzzer needs clang)" >&2; exit 2; }

# Global flags, not per-target ones: kiln_core must carry the coverage instrumentation too.
# -O0 keeps the build short; tests/fuzz/CMakeLists.txt raises the reader's own files to -O1.
sanitize="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
start=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -gline-tables-only" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DKILN_CUDA=OFF -DKILN_FUZZ=ON >/dev/null
targets=(fuzz_gguf fuzz_safetensors fuzz_chat_template fuzz_tokenizer_json fuzz_hf_config fuzz_sampler fuzz_request)
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
echo "fuzz.sh: built in $(( $(date +%s) - start )) s"

artifacts="$build/artifacts/"
mkdir -p "$artifacts"
half=$(( (seconds + 1) / 2 ))

# fuzz TARGET SECONDS MAX_LEN TIMEOUT [SEED_DIR... ] [-- LIBFUZZER_FLAGS...]: runs tests/fuzz/TARGET
# on its corpus (build-fuzz/corpus_TARGET: what libFuzzer finds, kept between local runs) and the
# seed folders; exits the script on a crash, with the input in build-fuzz/artifacts/.
fuzz() {
  local target=$1 time=$2 max_len=$3 timeout=$4
  shift 4
  local dirs=() flags=()
  while (($#)) && [[ $1 != -- ]]; do dirs+=("$1"); shift; done
  (($#)) && shift && flags=("$@")
  mkdir -p "$build/corpus_$target"
  "$build/tests/fuzz/$target" "$build/corpus_$target" "${dirs[@]}" "${flags[@]}" \
    -max_total_time="$time" -max_len="$max_len" -timeout="$timeout" \
    -rss_limit_mb=2048 -malloc_limit_mb=256 \
    -artifact_prefix="$artifacts" -print_final_stats=1
}

# seeds TARGET: a fresh folder of the seeds TARGET writes itself (TARGET --write-seeds DIR).
seeds() {
  rm -rf "$build/seeds_$1"
  mkdir -p "$build/seeds_$1"
  "$build/tests/fuzz/$1" --write-seeds "$build/seeds_$1" >&2
  echo "$build/seeds_$1"
}

# The GGUF reader: valid files, and inputs that once crashed it (regression seeds).
gguf_extra=()
[[ -d "$root/tests/data/gguf_corpus" ]] && gguf_extra+=("$root/tests/data/gguf_corpus")
fuzz fuzz_gguf "$seconds" 8192 10 "$(seeds fuzz_gguf)" "${gguf_extra[@]}" -- -dict="$root/tests/fuzz/gguf.dict"

# The safetensors header parser (a JSON header over raw bytes).
fuzz fuzz_safetensors "$half" 4096 10 "$(seeds fuzz_safetensors)"

# The Jinja interpreter on templates (a model file's chat template is untrusted input), from the
# real templates of tests/data/chat_templates. A 60 s timeout: an input that builds a value up to
# the sandbox's 64 MiB limit takes ~15 s under the sanitizers (0.9 s in a release build).
fuzz fuzz_chat_template "$half" 8192 60 "$root/tests/data/chat_templates" -- -dict="$root/tests/fuzz/jinja.dict"

# tokenizer.json documents (a Hugging Face directory is untrusted input), from small valid ones.
fuzz fuzz_tokenizer_json "$half" 16384 10 "$root/tests/data/tokenizer_json_corpus"

# A Hugging Face directory's config.json, from the test directories' files.
hf_seeds="$build/seeds_fuzz_hf_config"
rm -rf "$hf_seeds"
mkdir -p "$hf_seeds"
for d in "$root"/tests/data/hf/*/; do
  [[ -f "$d/config.json" ]] && cp "$d/config.json" "$hf_seeds/$(basename "$d").json"
done
fuzz fuzz_hf_config "$half" 4096 10 "$hf_seeds"

# The CPU sampler on any parameters, logits (NaN and infinities too) and history: from nothing
# (its input is binary).
fuzz fuzz_sampler "$half" 2048 10

# Request bodies of /v1/completions and /v1/chat/completions (parsing, validation, chat rendering,
# tokenization) against the default model's tokenizer.json and template.
fuzz fuzz_request "$half" 4096 10 "$(seeds fuzz_request)" -- -dict="$root/tests/fuzz/request.dict"

echo "fuzz.sh: no crash in ${seconds} s (GGUF) + 6 x ${half} s (safetensors, chat templates, tokenizer.json," \
  "config.json, sampler, requests) of fuzzing" \
  "($(( $(date +%s) - start )) s in all)"
