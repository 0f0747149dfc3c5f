#!/usr/bin/env bash
# Everything that needs a GPU, in one short run on one GPU (about 10 minutes):
# the start-up, steady-step, fit and embedding benchmarks at their usual sizes
# (fewer rounds), and the tests marked `gpu`. Each part has its own time limit,
# so one slow part cannot take the others' time; every table goes to OUT.
#
#     bash benchmarks/gpu_check.sh [OUT]      # OUT: a folder, default ./gpu_check
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-gpu_check}}")
mkdir -p "$out"
# a machine without TensorFlow installs the project first (that needs a registry)
python -c "import tensorflow, gradpipe" 2>/dev/null ||
    python -m pip install -q -e ".[test]" >"$out/install.log" 2>&1 || {
        echo "no TensorFlow here and the install failed: $out/install.log"; exit 1; }
python - <<'PY' | tee "$out/devices.txt"
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("GPUs:", gpus)
if not gpus:
    raise SystemExit("no GPU visible: nothing to check here")
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
run() {  # run NAME SECONDS COMMAND...: its output in OUT/NAME.txt, its status shown
    local name=$1 limit=$2; shift 2
    (cd benchmarks && timeout "$limit" "$@") >"$out/$name.txt" 2>&1
    echo "$name: exit $? ($(grep -c . "$out/$name.txt") lines)"
}
run first_step 240 python first_step.py --models dense --rules SGD,Adam,RMSprop,Nadam,Adamax,adabelief
run rules 150 python rules.py --rules Adam,RMSprop,Nadam,adabelief --repeats 7
run step 90 python step.py --repeats 11
run fit 90 python fit.py --repeats 11
run embeddings 60 python embeddings.py --repeats 11
(timeout 120 python -m pytest -q -m gpu tests) >"$out/tests.txt" 2>&1
echo "tests (-m gpu): exit $? ($(tail -1 "$out/tests.txt"))"
