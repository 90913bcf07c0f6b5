#!/usr/bin/env bash
# Sets up the machine (tools/setup.sh), builds the server and the bundled
# example artifacts, and serves them: gRPC (KServe v2, admin, health,
# reflection) on port 8001, HTTP/REST on 8000, Prometheus metrics on
# http://localhost:8002/metrics. While it serves, it builds the client tools
# (precompile_client, precompile_load), then captures the gallery's models
# (BERT, a RoBERTa classifier, OPT, GPT-2 without and with its cache, a Llama with its cache, a T5 with
# its cache of both attentions, resnet18, BERT behind a flagged wrapper), which join the server one by one: each
# finished artifact is moved into the repository, which the server rescans
# every 2 seconds. The three decoders join twice: as captured, and as
# <model>_stateful with gallery/decoder_stateful.config.pbtxt (T5:
# gallery/t5_decoder_stateful.config.pbtxt), the server keeping each
# sequence's cache.
#
# It listens on 127.0.0.1 only and lets any local client load, unload and
# rescan models without a token (--allow_unauthenticated_control): a
# development setup. Extra arguments go to the server and win over these
# (see `precompile_server --help`); e.g. --listen_address=0.0.0.0
# --allow_unauthenticated_control=false --admin_token_file=FILE to serve
# others. Ctrl-C or SIGTERM drains and stops it; the exit status is the
# server's.
#
# Environment: SERVE_REPOSITORY, the model repository it fills (default
# .serve/repository; emptied first).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[serve] $*"; }

tools/setup.sh
targets=(//server:precompile_server //examples:artifacts)
say "bazel build ${targets[*]}"
bazel build "${targets[@]}"

# A model repository of plain copies: <repository>/<model>/1/. An artifact
# arrives whole: it is copied next to the repository, then renamed into it.
repository=${SERVE_REPOSITORY:-.serve/repository}
staging=$repository.staging
rm -rf "$repository" "$staging"
mkdir -p "$repository" "$staging"
# publish ARTIFACT [NAME [CONFIG]]: serves ARTIFACT as model NAME (its
# directory's name by default), with CONFIG as its config.pbtxt.
publish() {
  local artifact=$1 name=${2:-$(basename "$1")} config=${3:-}
  if [[ ! -f $artifact/MANIFEST.pb ]]; then
    say "$artifact has no MANIFEST.pb: not an artifact, not served"
    return 1
  fi
  rm -rf "${staging:?}/$name"
  mkdir -p "$staging/$name"
  cp -rL "$artifact" "$staging/$name/1"
  if [[ -n $config ]]; then cp "$config" "$staging/$name/config.pbtxt"; fi
  mv "$staging/$name" "$repository/$name"
}
for artifact in bazel-bin/examples/{branch,dtypes,loop,mlp,nested,passthrough}; do
  publish "$artifact" || true
done
say "serving $(ls "$repository" | tr '\n' ' ')from $repository"

# Job control: the server and the gallery's builds run in process groups of
# their own, so that Ctrl-C reaches this script alone, which then drains the
# server (SIGTERM) and stops the builds.
set -m

# Python eager programs (the gallery's *_recentering models) are code: they load
# only with --allow_python_programs. They carry the models' own code
# (gallery.models) by value and import transformers from the environment.
bazel-bin/server/precompile_server --model_repository="$repository" \
  --listen_address=127.0.0.1 --allow_unauthenticated_control \
  --allow_python_programs --repository_poll_seconds=2 "$@" &
server=$!

# While it serves: the client tools, then the gallery, smallest capture
# first; each model joins at the next rescan.
clients=(//client:precompile_client //client:precompile_load)
gallery=(resnet18 bert roberta opt gpt2 gpt2_decoder llama_decoder t5_decoder bert_recentering gpt2_decoder_recentering)
(
  if bazel build --noshow_progress "${clients[@]}" 2>"$staging/clients.log"; then
    say "client tools ready: bazel-bin/client/precompile_client, bazel-bin/client/precompile_load"
  else
    say "building the client tools failed; its log: $staging/clients.log"
  fi
  for i in "${!gallery[@]}"; do
    model=${gallery[$i]}
    left=("${gallery[@]:$((i + 1))}")
    say "gallery: capturing $model (AOTInductor compiles take a while); then ${left[*]:-nothing}"
    if ! bazel build --noshow_progress "//gallery:$model" 2>"$staging/$model.log"; then
      say "gallery: capturing $model failed; its log: $staging/$model.log"
      continue
    fi
    if publish "bazel-bin/gallery/$model"; then
      say "gallery: $model is in the repository and loads at the next rescan; still to capture: ${left[*]:-none}"
    fi
    # The decoder-only models share a state config; T5 has its own.
    stateful_config=gallery/${model}_stateful.config.pbtxt
    [[ -f $stateful_config ]] || stateful_config=gallery/decoder_stateful.config.pbtxt
    if [[ $model == *_decoder ]] &&
      publish "bazel-bin/gallery/$model" "${model}_stateful" "$stateful_config"; then
      say "gallery: ${model}_stateful (the server keeps its cache) is in the repository too"
    fi
  done
) &
gallery_builder=$!

stop_gallery() { kill -INT -- "-$gallery_builder" 2>/dev/null || true; }
stop() {
  kill -TERM "$server" 2>/dev/null || true
  stop_gallery
}
trap stop INT TERM
# wait returns early when a trapped signal arrives: wait again for the drain.
status=0
while kill -0 "$server" 2>/dev/null; do
  wait "$server" && status=0 || status=$?
done
stop_gallery
wait "$gallery_builder" 2>/dev/null || true
exit "$status"
