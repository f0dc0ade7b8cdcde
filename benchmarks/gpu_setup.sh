# Sourced by the device-call scripts (gpu_one_row.sh, gpu_one_row_default.sh, gpu_encoder_sms.sh): install the
# wheels carried in .whl_gpu and record the GPU in OUT/gpu.txt.
#   source benchmarks/gpu_setup.sh OUT
# The full-size checkpoint's tokenizer is built from mistral-common's bundled vocabulary, which the GPU machine
# lacks: bring its wheel (python3 -m pip download --no-deps --only-binary=:all: -d .whl_gpu mistral-common==1.13.1)
# and carry .whl_gpu.
if ls .whl_gpu/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_gpu/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "${1:?out dir}/gpu.txt"
