# What the GPU run scripts share (sourced, after `cd` to the repository root and with $out set): the
# environment, the machine's versions at the top of OUT/run.log, and `step`, which runs a command with a time
# limit, its output to the screen and OUT/run.log, and remembers a failure in $status.
set -o pipefail  # a step fails with its command, not with tee
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
status=0

step() {  # step SECONDS NAME COMMAND...
    local limit=$1 name=$2
    shift 2
    echo "== $name: $*" | tee -a "$out/run.log"
    if ! timeout "$limit" "$@" 2>&1 | tee -a "$out/run.log"; then
        echo "== $name failed or timed out" | tee -a "$out/run.log"
        status=1
    fi
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$python" -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| triton', triton.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name())"
} 2>&1 | tee -a "$out/run.log"
