#!/usr/bin/env bash
# Fuzzes the GGUF reader for SECONDS, then the safetensors reader, the chat-template interpreter, the
# tokenizer.json reader, the config.json reader, the CPU sampler and the OpenAI request path for half
# that each: scripts/fuzz.sh [SECONDS] (default 60).
#
# Builds tests/fuzz/fuzz_gguf with clang in its own folder (build-fuzz), with all of kiln_core
# compiled under ASan+UBSan and libFuzzer's coverage instrumentation so the parser itself is
# explored, writes a seed corpus of valid GGUF files, then runs libFuzzer. Exits nonzero when the
# fuzzer finds a crash, undefined behaviour, a leak, a slow input or a single allocation over
# 256 MB (the reader must never allocate much more than the file); the input that did it is left
# in build-fuzz/artifacts/ (reproduce: build-fuzz/tests/fuzz/fuzz_gguf FILE).
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
cmake --build "$build" -j"$jobs" --target fuzz_gguf fuzz_safetensors fuzz_chat_template fuzz_tokenizer_json fuzz_hf_config fuzz_sampler fuzz_request
echo "fuzz.sh: built in $(( $(date +%s) - start )) s"

bin="$build/tests/fuzz/fuzz_gguf"
seeds="$build/seeds"
corpus="$build/corpus"        # what libFuzzer finds; kept between local runs
artifacts="$build/artifacts/"
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
"$bin" --write-seeds "$seeds"
extra=()
# Inputs that once crashed the reader, kept as regression seeds.
[[ -d "$root/tests/data/gguf_corpus" ]] && extra+=("$root/tests/data/gguf_corpus")

"$bin" "$corpus" "$seeds" "${extra[@]}" \
  -dict="$root/tests/fuzz/gguf.dict" \
  -max_total_time="$seconds" -max_len=8192 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1

# The safetensors header parser, for half the time (its format is a JSON header over raw bytes).
st_bin="$build/tests/fuzz/fuzz_safetensors"
st_seeds="$build/seeds_safetensors"
st_corpus="$build/corpus_safetensors"
rm -rf "$st_seeds"
mkdir -p "$st_seeds" "$st_corpus"
"$st_bin" --write-seeds "$st_seeds"
"$st_bin" "$st_corpus" "$st_seeds" \
  -max_total_time="$(( (seconds + 1) / 2 ))" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1
# The Jinja interpreter on templates (a model file's chat template is untrusted input), from the
# real templates of tests/data/chat_templates. A 60 s timeout: an input that builds a value up to
# the sandbox's 64 MiB limit takes ~15 s under the sanitizers (0.9 s in a release build).
half=$(( (seconds + 1) / 2 ))
jinja_corpus="$build/corpus_chat_template"
mkdir -p "$jinja_corpus"
"$build/tests/fuzz/fuzz_chat_template" "$jinja_corpus" "$root/tests/data/chat_templates" \
  -dict="$root/tests/fuzz/jinja.dict" \
  -max_total_time="$half" -max_len=8192 -timeout=60 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1

# tokenizer.json documents (a Hugging Face directory is untrusted input), from small valid ones.
tok_corpus="$build/corpus_tokenizer_json"
mkdir -p "$tok_corpus"
"$build/tests/fuzz/fuzz_tokenizer_json" "$tok_corpus" "$root/tests/data/tokenizer_json_corpus" \
  -max_total_time="$half" -max_len=16384 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1

# A Hugging Face directory's config.json, from the test directories' files.
hf_seeds="$build/seeds_hf_config"
hf_corpus="$build/corpus_hf_config"
rm -rf "$hf_seeds"
mkdir -p "$hf_seeds" "$hf_corpus"
for d in "$root"/tests/data/hf/*/; do
  [[ -f "$d/config.json" ]] && cp "$d/config.json" "$hf_seeds/$(basename "$d").json"
done
"$build/tests/fuzz/fuzz_hf_config" "$hf_corpus" "$hf_seeds" \
  -max_total_time="$half" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1

# The CPU sampler on any parameters, logits (NaN and infinities too) and history: from nothing
# (its input is binary).
sampler_corpus="$build/corpus_sampler"
mkdir -p "$sampler_corpus"
"$build/tests/fuzz/fuzz_sampler" "$sampler_corpus" \
  -max_total_time="$half" -max_len=2048 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1

# Request bodies of /v1/completions and /v1/chat/completions (parsing, validation, chat rendering,
# tokenization) against the default model's tokenizer.json and template.
req_bin="$build/tests/fuzz/fuzz_request"
req_seeds="$build/seeds_request"
req_corpus="$build/corpus_request"
rm -rf "$req_seeds"
mkdir -p "$req_seeds" "$req_corpus"
"$req_bin" --write-seeds "$req_seeds"
"$req_bin" "$req_corpus" "$req_seeds" \
  -dict="$root/tests/fuzz/request.dict" \
  -max_total_time="$half" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -artifact_prefix="$artifacts" -print_final_stats=1
echo "fuzz.sh: no crash in ${seconds} s (GGUF) + 6 x ${half} s (safetensors, chat templates, tokenizer.json," \
  "config.json, sampler, requests) of fuzzing" \
  "($(( $(date +%s) - start )) s in all)"
