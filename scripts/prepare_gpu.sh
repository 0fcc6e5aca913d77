#!/usr/bin/env bash
# Prepares, on this (Debian, apt-capable) machine, what a GPU machine call of
# scripts/gpu.sh needs and cannot fetch there (no apt, no internet): GoogleTest's
# source. Installs Debian's 'googletest' package if it is missing (as
# scripts/setup.sh does) and copies its source tree, /usr/src/googletest, into
# the git-ignored .gpu/googletest, where scripts/gpu.sh finds it.
#
# Ignored folders reach the GPU machine only when named: give the device call
# carry: [".gpu"] (the working tree plus carried folders must stay under 64 MiB;
# this prints what the copy and the whole transfer weigh).
#
# Idempotent: a second run only checks that the copy matches the package.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src=/usr/src/googletest
dest="$root/.gpu/googletest"
max_kib=$((16 * 1024))   # the copy is ~4 MiB; refuse anything near the 64 MiB carry limit

if ! dpkg-query -W -f='${Status}' googletest 2>/dev/null | grep -q "install ok installed"; then
  echo "prepare_gpu: installing Debian package: googletest"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q googletest >/dev/null
fi
[ -f "$src/CMakeLists.txt" ] || { echo "prepare_gpu: $src/CMakeLists.txt missing after installing googletest" >&2; exit 1; }

if [ -d "$dest" ] && diff -rq "$src" "$dest" >/dev/null 2>&1; then
  echo "prepare_gpu: $dest is up to date"
else
  echo "prepare_gpu: copying $src to $dest"
  mkdir -p "$root/.gpu"
  rm -rf "$dest.tmp" "$dest"
  cp -rL "$src" "$dest.tmp"   # -L: links would travel as links, not as files
  mv "$dest.tmp" "$dest"
fi

kib=$(du -sk "$dest" | cut -f1)
echo "prepare_gpu: .gpu/googletest is $(du -sh "$dest" | cut -f1) ($(find "$dest" -type f | wc -l) files)"
if ((kib > max_kib)); then
  echo "prepare_gpu: .gpu/googletest is over $((max_kib / 1024)) MiB: too much to carry" >&2
  exit 1
fi
# What one device call moves: tracked and untracked-not-ignored files, plus .gpu.
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  tree_bytes=$(cd "$root" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
  gpu_bytes=$(du -sb "$root/.gpu" | cut -f1)
  echo "prepare_gpu: working tree $((tree_bytes / 1024)) KiB + .gpu $((gpu_bytes / 1024)) KiB" \
    "= $(((tree_bytes + gpu_bytes) / 1024 / 1024)) MiB of the 64 MiB a call may carry"
fi
