#!/usr/bin/env bash
# Models and datasets by Hub name, end to end against the local Hub server (docs/hub.md), in a
# temporary folder: a train run that downloads, the same run offline, the cache it left, and the
# one-line errors of a missing repo, a private one, a gated one and an offline miss.
#
#   bash scripts/hub-demo.sh [PORT]
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
port="${1:-8765}"
work="$(mktemp -d "${TMPDIR:-/tmp}/prefzoo-hub-demo-XXXXXX")"
cd "$work"
(cd "$here" && exec node --import tsx scripts/hub-local-server.ts --port "$port" --dir "$work/fixtures") > server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 1 240); do grep -q "serving" server.log 2>/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 0.5; done
cat server.log
grep -q "serving" server.log || exit 1
export HF_ENDPOINT="http://127.0.0.1:$port" HF_HUB_CACHE="$work/hf-cache"
unset HF_TOKEN HF_HUB_OFFLINE
pz() { node "$here/bin/prefzoo.mjs" "$@"; }
show() { printf '\n$ %s\n' "$*"; }

show prefzoo train --model tiny-org/tiny-llama --data tiny-org/tiny-prefs --loss dpo -o run1 --param max_steps=2
pz train --model tiny-org/tiny-llama --data tiny-org/tiny-prefs --loss dpo -o run1 --param max_steps=2 2>&1
show HF_HUB_OFFLINE=1 prefzoo train --model tiny-org/tiny-llama --data tiny-org/tiny-prefs --loss dpo -o run2 --param max_steps=2
HF_HUB_OFFLINE=1 pz train --model tiny-org/tiny-llama --data tiny-org/tiny-prefs --loss dpo -o run2 --param max_steps=2 2>&1
show 'find $HF_HUB_CACHE | head'
find "$HF_HUB_CACHE" | head
show 'ls -l $HF_HUB_CACHE/models--tiny-org--tiny-llama/snapshots/*/'
ls -l "$HF_HUB_CACHE"/models--tiny-org--tiny-llama/snapshots/*/
show "node -e 'console.log(require(\"./run2/config.json\").hub)'"
node -e 'console.log(JSON.stringify(require("./run2/config.json").hub, null, 1))'
for m in tiny-org/no-such-model tiny-org/private-llama tiny-org/gated-llama; do
  show prefzoo train --model "$m" --data tiny-org/tiny-prefs --loss dpo -o run3
  pz train --model "$m" --data tiny-org/tiny-prefs --loss dpo -o run3
done
show HF_HUB_OFFLINE=1 prefzoo train --model tiny-org/gated-llama --data tiny-org/tiny-prefs --loss dpo -o run3
HF_HUB_OFFLINE=1 pz train --model tiny-org/gated-llama --data tiny-org/tiny-prefs --loss dpo -o run3
printf '\n(files in %s)\n' "$work"
