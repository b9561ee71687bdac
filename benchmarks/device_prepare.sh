#!/usr/bin/env bash
# Sets a GPU machine up for the benchmarks from what travelled with the working tree:
#   source benchmarks/device_prepare.sh
# - .carry/minilm-xz (`make bench_carry`): all-MiniLM-L6-v2 with its weights in float16,
#   xz-compressed to fit the transfer limit, is unpacked in place;
# - the wheel in dist/ (`make wheel`) is installed with --no-deps into /tmp/site, whose
#   bin/ holds `text-embeddings-router`;
# and exports PYTHONPATH, PATH, HF_HUB_OFFLINE and TRT_TEI_MINILM_DIR for them.
minilm=$PWD/.carry/minilm-xz
if [[ -f $minilm/model.safetensors.xz ]]; then
    python3 -c "import lzma, shutil, sys
with lzma.open(sys.argv[1]) as f, open(sys.argv[2], 'wb') as g: shutil.copyfileobj(f, g)" \
        "$minilm/model.safetensors.xz" "$minilm/model.safetensors"
    rm "$minilm/model.safetensors.xz"
fi
python3 -m pip install -q --no-deps --upgrade --target /tmp/site dist/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 TRT_TEI_MINILM_DIR=$minilm
