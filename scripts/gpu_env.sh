# Sourced by the scripts that run on the GPU machine (gpu_suite.sh, tg_env_ab.sh, decode_ab.sh):
#   source scripts/gpu_env.sh DIR
# DIR is a build folder or a bundle (scripts/gpu_bundle.sh); a bundle carried packed as DIR.tgz is
# unpacked first. Sets LD_LIBRARY_PATH (kiln's shared library and libcupti, kiln profile's kernel
# timer, from DIR/src first; cuBLAS, the kernel lab's baseline, from the machine's CUDA toolkit),
# OUT (default ./gpu-out, created) and K (the kiln CLI).
gpu_dir="$1"
if [ ! -d "$gpu_dir" ] && [ -f "$gpu_dir.tgz" ]; then tar xzf "$gpu_dir.tgz"; fi
export LD_LIBRARY_PATH="$(cd "$gpu_dir" 2>/dev/null && pwd)/src:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
K="$gpu_dir/tools/kiln"
