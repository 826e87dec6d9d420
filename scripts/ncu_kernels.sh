#!/usr/bin/env bash
# Runs Nsight Compute (on the GPU machine) over the decode kernels of a kiln bench run and prints
# the figures that explain each one: DRAM and SM throughput, occupancy, registers, shared memory
# and warp-stall reasons. Clocks are left alone (--clock-control none), as the lab's rules ask.
#   scripts/ncu_kernels.sh BUNDLE_DIR [KERNEL_REGEX] [LAUNCH_COUNT]
set -euo pipefail
BUNDLE="${1:-gpu-bundle}"
REGEX="${2:-gemv|attention|rmsnorm|rope}"
COUNT="${3:-8}"
ncu --clock-control none --kernel-name "regex:$REGEX" --launch-count "$COUNT" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \
  "$BUNDLE/tools/kiln" bench --random llama3-8b -p 0 -n 2 -r 0 2>&1 | tee "${OUT:-.}/ncu.txt" |
  grep -E "^  [a-z_]|^    (Section|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Duration|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Dynamic Shared Memory|Static Shared Memory|Block Size|Grid Size|Warp Cycles Per Issued|dram__throughput|lts__t_sector_hit_rate)|Stall|stall" || true
