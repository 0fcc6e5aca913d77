# Sourced by test.sh and docs.sh: install_conveyor_package WHO ROOT BUILD installs
# the Python package into ROOT/.venv as a user installs it (pip install .),
# built in the build directory already made, so that the library is not
# compiled a second time.
install_conveyor_package() {
  local who="$1" root="$2" build="$3" t0
  t0=$(date +%s)
  "$root/.venv/bin/python" -m pip install -q --no-build-isolation --no-deps -C build-dir="$build" "$root" \
    >"$build/pip-install.log" 2>&1 ||
    { tail -n 40 "$build/pip-install.log" >&2; echo "$who: pip install . failed (log: $build/pip-install.log)" >&2; return 1; }
  echo "$who: installed the conveyor package into .venv in $(( $(date +%s) - t0 )) s"
}
