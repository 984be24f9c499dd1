#!/usr/bin/env bash
# Decoder backbone on a CUDA GPU: prefill + option-scoring latency (p50/p95) and throughput
# for 1, 16 and 64 options at batch 1 and 32, on a random ~1.7B Qwen3 config built in code
# (nothing downloaded). Writes benchmarks/results/decoder_gpu.json.
#
#   bash benchmarks/gpu/run.sh            # full run (~3-5 minutes on an H100/H200)
#   bash benchmarks/gpu/run.sh --quick    # smaller model and fewer repeats (~1 minute)
#   bash benchmarks/gpu/run.sh --compile  # also torch.compile the decoder
#
# Needs the package importable (pip install -e . on a fresh machine) and a CUDA build of torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}" python benchmarks/gpu/decoder_gpu.py "$@"
