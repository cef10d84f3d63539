# Source at the start of a device-tool command (bash): `source benchmarks/device_env.sh; make test-gpu ...`
# with carry [".gpu", ".whl"] (made here by `make gpu-wheels gpu-carry`). It installs the carried wheels into
# /tmp/site, puts this checkout and them on PYTHONPATH, copies the carried trained models to ../shared/models
# where there is none (where the tests and benchmarks look), unbuffers Python's output, and defines `el`,
# which prints its arguments after the seconds since sourcing (a command cut at its time limit still says
# how far it got),
# and `with_old CMD...`, which runs CMD on the previous revision's package carried in .old, or in $OLD_DIR
# (`make old-tree [OLD_DIR=.old-NAME]`; run scripts by path: `python3 -m` and `-c` put the current
# directory, this checkout, first).
# Triton's compiled kernels: a fresh machine compiles them all again (the GPU suite took 250 s cold against
# 61 s warm, session 24; an 8B benchmark's sizing 94 s against 22, session 35). `save_triton_cache` writes
# the cache's binaries and metadata, without the IR a cache hit never reads, as $OUT/triton-cache.txz
# (benchmarks/triton_cache.py); `make triton-cache FROM=that.txz` here keeps it in the git-excluded .triton,
# and a later call that carries ".triton" starts with those kernels compiled (TRITON_CACHE_DIR below).
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/triton-cache
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton/triton-cache.txz ]; then
  python3 benchmarks/triton_cache.py load .triton/triton-cache.txz || echo "device_env: the Triton cache did not load"
fi
save_triton_cache() {
  python3 benchmarks/triton_cache.py save "${OUT:?save_triton_cache: no OUT}/triton-cache.txz" "$@"
}
# At most 8 files come back from $OUT a call (the device tool's limit): `pack_out` at the end of a command
# puts every other file there (not *.tgz, *.txz) into $OUT/results.tgz; here, `tar -xzf .../results.tgz -C DIR`.
pack_out() {
  local files
  files=$(cd "${OUT:?pack_out: no OUT}" && find . -maxdepth 1 -type f ! -name '*.tgz' ! -name '*.txz' -printf '%P\n')
  [ "$(echo "$files" | grep -c .)" -le 7 ] && return 0
  (cd "$OUT" && echo "$files" | tar -czf results.tgz --remove-files -T -) \
    && echo "pack_out: $(echo "$files" | grep -c .) files in results.tgz"
}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >/dev/null 2>&1 || echo "device_env: installing .whl/*.whl failed"
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .gpu/models ]; then
  # never over an existing ../shared/models (a development checkout's own, which holds more than the carry)
  if [ ! -e ../shared/models ]; then mkdir -p ../shared && cp -r .gpu/models ../shared/models; fi
else
  echo "device_env: no .gpu/models carried: the trained-model tests will skip"
fi
DEVICE_ENV_T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - DEVICE_ENV_T0 ))s] $*"; }
with_old() {
  local dir="${OLD_DIR:-.old}"
  if [ ! -f "$dir/REV" ]; then
    echo "with_old: no $dir carried (make old-tree OLD_REV=... OLD_DIR=$dir, carry $dir)" >&2; return 2
  fi
  PYTHONPATH="$PWD/$dir:$PYTHONPATH" "$@"
}
