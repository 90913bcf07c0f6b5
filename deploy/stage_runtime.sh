#!/usr/bin/env bash
# Lays out what the runtime image needs from a build of precompile_server
# (deploy/Dockerfile runs it in the builder stage; deploy/tests runs it too):
#
#   DEST/bin/precompile_server          run path $ORIGIN/../torch/lib
#   DEST/torch/lib/libtorch.so          the CPU-only stand-in (bazel/torch.bzl)
#   DEST/torch/lib/libtorch_cpu.so ...  the libraries of the torch wheel that
#   DEST/nvidia/<pkg>/lib/...           the server loads, wheel layout kept
#
# The wheel's libraries find each other through their own run paths
# ($ORIGIN and $ORIGIN/../../nvidia/<pkg>/lib), so keeping the wheel's layout
# under DEST keeps them working. The server and the stand-in are linked with
# absolute run paths into the build tree (.venv, Bazel's output base); they
# are rewritten relative to $ORIGIN (patchelf), so the image needs no
# LD_LIBRARY_PATH and no path of the build machine.
#
# Parts:
#   --part=cpu   the server and everything it loads (every image)
#   --part=cuda  what CUDA artifacts add: libtorch_cuda, which the runtime
#                loads on demand from libtorch_cpu's directory
#                (runtime/cuda_support.cc), its companions, and every CUDA
#                library of the wheel (nvidia/*/lib), less what --part=cpu has
#
#   --part=python  what Python eager programs add (runtime/python_program.h),
#                on top of cpu and cuda (the wheel's libtorch_python needs
#                libtorch_cuda):
#                  DEST/runtime/libprecompile_python.so   the plugin, found
#                      by the server next to its bin/ directory
#                  DEST/python/{bin,lib}   the Python the environment was made
#                      from: its executable, libpython and standard library
#                  DEST/venv               the environment (--python_env):
#                      its site-packages, with torch/lib and nvidia linked to
#                      DEST/torch/lib and DEST/nvidia rather than copied again,
#                      and the rest of the wheel's torch/lib added there;
#                      pyvenv.cfg names DEST/python/bin as installed at
#                      --install_dir
#
# Libraries from Debian (gRPC, protobuf, abseil, ...) are not copied: the image
# installs their packages. A library found anywhere else is an error.
#
# Usage: deploy/stage_runtime.sh --part=cpu|cuda|python [--binary=PATH]
#            [--venv=DIR] [--install_dir=DIR] [--link] [--dry-run] DEST
#   --binary   the server binary (default bazel-bin/server/precompile_server)
#   --venv     the Python environment (default .venv); --part=python only
#   --install_dir  where DEST will be in the image (default
#              /opt/precompile-serve): pyvenv.cfg names a path under it
#   --link     hard-link files that are not rewritten, rather than copy them
#              (DEST on the same file system as the sources; for tests)
#   --dry-run  print "source -> destination" lines, copy nothing
set -euo pipefail

part=""
binary=bazel-bin/server/precompile_server
venv=.venv
install_dir=/opt/precompile-serve
link=0
dry_run=0
dest=""
for arg in "$@"; do
  case "$arg" in
    --part=*) part=${arg#--part=} ;;
    --binary=*) binary=${arg#--binary=} ;;
    --venv=*) venv=${arg#--venv=} ;;
    --install_dir=*) install_dir=${arg#--install_dir=} ;;
    --link) link=1 ;;
    --dry-run) dry_run=1 ;;
    -*) echo "stage_runtime: unknown option $arg" >&2; exit 2 ;;
    *) dest=$arg ;;
  esac
done
if [[ $part != cpu && $part != cuda && $part != python ]] || [[ -z $dest ]]; then
  echo "usage: $0 --part=cpu|cuda|python [--binary=PATH] [--venv=DIR] [--install_dir=DIR] [--link] [--dry-run] DEST" >&2
  exit 2
fi
[[ -x $binary ]] || { echo "stage_runtime: no server binary at $binary" >&2; exit 1; }

# What the dynamic loader resolves for the binary, as it was built.
declare -A resolved=()
while read -r name arrow path _; do
  [[ $arrow == "=>" ]] || continue
  if [[ $path == "not" ]]; then
    echo "stage_runtime: $binary: $name is not found (run tools/setup.sh)" >&2
    exit 1
  fi
  resolved[$name]=$(readlink -f "$path")
done < <(ldd "$binary")

torch_cpu=${resolved[libtorch_cpu.so]:-}
[[ -n $torch_cpu ]] || { echo "stage_runtime: $binary does not load libtorch_cpu.so" >&2; exit 1; }
torch_lib=$(dirname "$torch_cpu")        # <site-packages>/torch/lib
site=$(dirname "$(dirname "$torch_lib")")  # <site-packages>

# source -> path under DEST
declare -A plan=()
add() { plan[$1]=$2; }

# The wheel's path for a library, or "" if it is not the wheel's.
wheel_path() {
  case "$1" in
    "$site"/torch/lib/*) echo "torch/lib/${1#"$site"/torch/lib/}" ;;
    "$site"/nvidia/*/lib/*) echo "nvidia/${1#"$site"/nvidia/}" ;;
    *) echo "" ;;
  esac
}

cuda_torch_libs=(libtorch_cuda.so libc10_cuda.so libtorch_nvshmem.so libtorch_cuda_linalg.so libcaffe2_nvrtc.so)

plan_cpu() {
  add "$(readlink -f "$binary")" bin/precompile_server
  for name in "${!resolved[@]}"; do
    path=${resolved[$name]}
    case "$path" in
      /lib/* | /usr/lib/* | /lib64/*) continue ;;  # Debian's: installed by apt in the image
    esac
    if [[ $name == libtorch.so ]]; then
      # The CPU-only stand-in, built into Bazel's torch repository.
      [[ $(wheel_path "$path") == "" ]] || {
        echo "stage_runtime: $binary loads the wheel's libtorch.so ($path), not the CPU-only stand-in" >&2
        exit 1
      }
      add "$path" torch/lib/libtorch.so
      continue
    fi
    to=$(wheel_path "$path")
    [[ -n $to ]] || { echo "stage_runtime: $name comes from $path, outside the torch wheel and Debian" >&2; exit 1; }
    add "$path" "$to"
  done
}

plan_cuda() {
  # Loaded by path from libtorch_cpu's directory, and what it loads lazily.
  for name in "${cuda_torch_libs[@]}"; do
    [[ -f $torch_lib/$name ]] || { echo "stage_runtime: the torch wheel has no $name: not a CUDA build?" >&2; exit 1; }
    add "$torch_lib/$name" "torch/lib/$name"
  done
  # Every CUDA library of the wheel: cuDNN, cuBLAS and others open parts of
  # themselves with dlopen, which no list of NEEDED entries shows.
  declare -A in_cpu=()
  for name in "${!resolved[@]}"; do in_cpu[${resolved[$name]}]=1; done
  while IFS= read -r -d '' path; do
    path=$(readlink -f "$path")
    [[ -z ${in_cpu[$path]:-} ]] || continue
    add "$path" "$(wheel_path "$path")"
  done < <(find "$site"/nvidia/*/lib -maxdepth 1 -type f -name '*.so*' -print0)
}

# The environment's Python: `python` is its executable, `stdlib` and
# `dynload` its standard library (Debian keeps lib-dynload inside it; a
# Python built from source too).
python_version=""
trees=()  # source, path under DEST; pairs
plan_python() {
  local plugin
  plugin=$(dirname "$binary")/../runtime/libprecompile_python.so
  [[ -f $plugin ]] || { echo "stage_runtime: no Python plugin at $plugin (bazel build //runtime:libprecompile_python.so)" >&2; exit 1; }
  [[ -x $venv/bin/python3 && -f $venv/pyvenv.cfg ]] || { echo "stage_runtime: $venv is not a Python environment" >&2; exit 1; }

  # torch/lib: what neither the cpu nor the cuda part stages.
  local -A staged=()
  plan_cpu
  plan_cuda
  for from in "${!plan[@]}"; do staged[${plan[$from]}]=1; done
  plan=()
  add "$(readlink -f "$plugin")" runtime/libprecompile_python.so
  local path
  for path in "$torch_lib"/*; do
    [[ -f $path ]] || continue
    [[ -z ${staged[torch/lib/$(basename "$path")]:-} ]] || continue
    add "$path" "torch/lib/$(basename "$path")"
  done

  local base_executable stdlib venv_site
  read -r python_version base_executable stdlib libpython venv_site < <("$venv/bin/python3" -c '
import os, sys, sysconfig
lib = os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or "")
paths = sysconfig.get_paths()
print(sysconfig.get_python_version(), os.path.realpath(sys._base_executable),
      paths["stdlib"], os.path.realpath(lib), paths["purelib"])')
  [[ -f $libpython ]] || { echo "stage_runtime: $venv's Python has no shared libpython ($libpython)" >&2; exit 1; }
  add "$base_executable" "python/bin/python$python_version"
  add "$libpython" "python/lib/$(basename "$libpython")"
  # Two trees, copied after the files: the standard library (less its
  # tests, IDLE, Tk and what pip installed) and the environment's packages
  # (less what is staged under torch/lib and nvidia, and the .pth that names
  # this build's tree).
  trees=("$stdlib" "python/lib/python$python_version"
         "$venv_site" "venv/lib/python$python_version/site-packages")
}

case $part in
  cpu) plan_cpu ;;
  cuda) plan_cuda ;;
  python) plan_python ;;
esac

if ((dry_run)); then
  for from in "${!plan[@]}"; do echo "$from -> ${plan[$from]}"; done | sort -k3
  for ((i = 0; i < ${#trees[@]}; i += 2)); do echo "${trees[i]}/ -> ${trees[i + 1]}/"; done
  exit 0
fi

# Directory trees, with the environment's Python: one process, not one per
# file (site-packages holds tens of thousands).
for ((i = 0; i < ${#trees[@]}; i += 2)); do
  "$venv/bin/python3" - "${trees[i]}" "$dest/${trees[i + 1]}" "$link" <<'PY'
import os, shutil, sys
source, target, link = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
skip_names = {"__pycache__", "site-packages", "dist-packages", "precompile_serve.pth"}
skip_top = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "nvidia"}
def ignore(directory, names):
    top = os.path.realpath(directory) == os.path.realpath(source)
    # Tk and NIS (deprecated; its libraries pull in Kerberos) are left out.
    skipped = {n for n in names if n in skip_names or n.startswith(("_tkinter.", "nis."))
               or (top and (n in skip_top or n.startswith("config-")))}
    if os.path.basename(directory) == "torch" and os.path.dirname(os.path.realpath(directory)) == os.path.realpath(source):
        skipped.add("lib")
    return skipped
def copy(src, dst):
    # Extension modules may be rewritten (their run path): never links.
    if link and not (src.endswith(".so") and "lib-dynload" in src):
        try:
            return os.link(src, dst)
        except OSError:
            pass
    return shutil.copy2(src, dst)
shutil.copytree(source, target, symlinks=True, ignore=ignore, copy_function=copy, dirs_exist_ok=True)
# A link out of the tree (Debian's sitecustomize.py into /etc) would dangle
# in the image: it becomes a copy of what it points to, or goes.
root = os.path.realpath(source)
for directory, dirs, files in os.walk(target):
    for name in dirs + files:
        path = os.path.join(directory, name)
        if not os.path.islink(path):
            continue
        pointed = os.path.realpath(os.path.join(source, os.path.relpath(path, target)))
        if pointed == root or pointed.startswith(root + os.sep):
            continue
        os.unlink(path)
        if os.path.isdir(pointed):
            shutil.copytree(pointed, path, ignore=ignore)
        elif os.path.isfile(pointed):
            shutil.copy2(pointed, path)
PY
done

# Files patchelf rewrites below: always copies, never links to the build's.
declare -A rewritten=(
  [bin/precompile_server]=1 [torch/lib/libtorch.so]=1
  [runtime/libprecompile_python.so]=1 [python/bin/python$python_version]=1
  [python/lib/$(basename "${libpython:-none}")]=1
)
for from in "${!plan[@]}"; do
  to=$dest/${plan[$from]}
  mkdir -p "$(dirname "$to")"
  if [[ -L $from && ${plan[$from]} == venv/* ]]; then
    cp -P "$from" "$to"  # A package's own link, kept as a link.
    continue
  fi
  if ((link)) && [[ -z ${rewritten[${plan[$from]}]:-} ]]; then
    ln -f "$from" "$to" 2>/dev/null && continue  # Else another file system: copy.
  fi
  cp -f "$from" "$to"
  [[ ${plan[$from]} == python/lib/python*/* || ${plan[$from]} == venv/* ]] || chmod 0755 "$to"
done

if [[ $part != cuda ]]; then
  patchelf --version >/dev/null 2>&1 || { echo "stage_runtime: patchelf is missing (tools/setup.sh installs it)" >&2; exit 1; }
fi
if [[ $part == cpu ]]; then
  patchelf --set-rpath '$ORIGIN/../torch/lib' "$dest/bin/precompile_server"
  patchelf --set-rpath '$ORIGIN' "$dest/torch/lib/libtorch.so"
fi
if [[ $part == python ]]; then
  patchelf --set-rpath '$ORIGIN/../torch/lib:$ORIGIN/../python/lib' "$dest/runtime/libprecompile_python.so"
  # A Python built with a shared libpython finds it by run path; Debian's
  # executable has it linked in.
  if readelf -d "$dest/python/bin/python$python_version" | grep -q 'NEEDED.*libpython'; then
    patchelf --set-rpath '$ORIGIN/../lib' "$dest/python/bin/python$python_version"
  fi
  # A Python built from source gives its extension modules a run path to its
  # prefix; they need nothing from there (libpython's symbols are global).
  while IFS= read -r -d '' module; do
    if readelf -d "$module" | grep -q 'R.*PATH'; then patchelf --remove-rpath "$module"; fi
  done < <(find "$dest/python/lib/python$python_version/lib-dynload" -name '*.so' -print0)
  # Its run path, if any, names the build machine's prefix.
  if readelf -d "$dest/python/lib/$(basename "$libpython")" | grep -q 'R.*PATH'; then
    patchelf --set-rpath '$ORIGIN' "$dest/python/lib/$(basename "$libpython")"
  fi
  # The environment, as `python -m venv` lays it out, pointing at the
  # staged Python where DEST is installed.
  site=venv/lib/python$python_version/site-packages
  mkdir -p "$dest/venv/bin" "$dest/$site/torch"
  ln -sfn "../../python/bin/python$python_version" "$dest/venv/bin/python3"
  ln -sfn python3 "$dest/venv/bin/python"
  ln -sfn "../../../../../torch/lib" "$dest/$site/torch/lib"
  ln -sfn "../../../../nvidia" "$dest/$site/nvidia"
  cat > "$dest/venv/pyvenv.cfg" <<CFG
home = $install_dir/python/bin
include-system-site-packages = false
version = $("$venv/bin/python3" -c 'import platform; print(platform.python_version())')
CFG
fi
echo "stage_runtime: staged ${#plan[@]} files and $((${#trees[@]} / 2)) trees (--part=$part) in $dest"
