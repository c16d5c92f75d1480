#!/usr/bin/env bash
# The PyTorch comparison (scripts/bench/torch_compare.sh) at small shapes on the CPU: proves that
# both PyTorch variants of scripts/bench/torch_dlrm.py run end to end and that the expert
# variant's step equals uvmrec's (parity) and the plain variant's (speed's check), before a GPU
# run times them.  Its times mean nothing.  About 10 minutes on 2 cores (torch.compile on the CPU
# builds C++ kernels with gcc).
#
#   PYTHON=build/torchvenv/bin/python bash scripts/bench/torch_peer_cpu.sh
#   (a CPU PyTorch: python3 -m venv build/torchvenv && build/torchvenv/bin/pip install torch numpy)
set -u
cd "$(dirname "$0")/../.." || exit 2
export TORCH_DEVICE=cpu
export UVMREC=${UVMREC:-build/bin/uvmrec}
export PYTHON=${PYTHON:-build/torchvenv/bin/python}
export OUT=${OUT:-build/torch_peer_cpu}
export WORK=${WORK:-/tmp/torch_peer_cpu}
export SKIP=${SKIP:-train}
export PARITY_DOT="--config dlrm_mlperf_v1 --set embeddings.max_rows=2000 --batch 256"
export PARITY_DCN="--config dlrm_dcnv2 --set embeddings.max_rows=2000 --batch 128"
export PARITY_CASES=${PARITY_CASES:-dot:f32:mlperf dot:bf16:mlperf dcnv2:bf16:dcnv2}
export PARITY_VARIANTS=${PARITY_VARIANTS:-plain expert}
SPEED="--config dlrm_mlperf_v1_2m --set embeddings.max_rows=3000 --batch 256 --precisions f32,bf16"
export SPEED_ARGS=${SPEED_ARGS:-$SPEED --steps 2}
exec bash scripts/bench/torch_compare.sh
