#!/usr/bin/env bash
# Sets up the machine (tools/setup.sh), builds the server, the bundled example
# artifacts and the gallery's (BERT, GPT-2, resnet18, BERT behind a flagged
# wrapper), and serves them: gRPC (KServe v2, admin, health,
# reflection) on port 8001, Prometheus metrics on http://localhost:8002/metrics.
# It listens on 127.0.0.1 only and lets any local client load, unload and
# rescan models without a token (--allow_unauthenticated_control): a
# development setup. Extra arguments go to the server and win over these
# (see `precompile_server --help`); e.g. --listen_address=0.0.0.0
# --allow_unauthenticated_control=false --admin_token_file=FILE to serve
# others. Ctrl-C or SIGTERM drains and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
echo "[serve] bazel build //server:precompile_server //examples:artifacts //gallery:artifacts"
bazel build //server:precompile_server //examples:artifacts //gallery:artifacts

# A model repository of plain copies: <repository>/<model>/1/.
repository=.serve/repository
rm -rf "$repository"
mkdir -p "$repository"
for artifact in bazel-bin/examples/*/ bazel-bin/gallery/*/; do
  [[ -f $artifact/MANIFEST.pb ]] || continue
  name=$(basename "$artifact")
  mkdir -p "$repository/$name"
  cp -rL "$artifact" "$repository/$name/1"
done
if [[ -z $(ls "$repository") ]]; then
  echo "[serve] no example artifacts yet"
fi
echo "[serve] serving $(ls "$repository" | tr '\n' ' ')from $repository"
# Python eager programs (the gallery's bert_recentering, examples' blocks)
# are code: they load only with --allow_python_programs, and import the
# models' own code (gallery.models, examples.models) from --python_path.
exec bazel-bin/server/precompile_server --model_repository="$repository" \
  --listen_address=127.0.0.1 --allow_unauthenticated_control \
  --allow_python_programs --python_path="$PWD" "$@"
