# Source at the start of a device-tool command (bash): `source benchmarks/device_env.sh; make test-gpu ...`
# with carry [".gpu", ".whl"] (made here by `make gpu-wheels gpu-carry`). It installs the carried wheels into
# /tmp/site, puts this checkout and them on PYTHONPATH, copies the carried trained models to ../shared/models
# (where the tests and benchmarks look), unbuffers Python's output, and defines `el`, which prints its
# arguments after the seconds since sourcing (so a command cut at its time limit still says how far it got).
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >/dev/null 2>&1 || echo "device_env: installing .whl/*.whl failed"
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .gpu/models ]; then
  mkdir -p ../shared && rm -rf ../shared/models && cp -r .gpu/models ../shared/models
else
  echo "device_env: no .gpu/models carried: the trained-model tests will skip"
fi
DEVICE_ENV_T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - DEVICE_ENV_T0 ))s] $*"; }
