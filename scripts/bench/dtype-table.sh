#!/usr/bin/env bash
# The per-dtype table of issue 45 (docs/performance.md, "Quantized rollouts"): `prefzoo demo --method M
# --param rollout_dtype=D` over seeds, each run's JSON and run folder kept in OUT/, then printed per
# demo: the final held-out accuracy per seed and dtype with its min / median / max, and from each run's
# metrics.jsonl (the training rows) the sampler–trainer gap — sampling/sampling_logp_difference/mean
# and /max, sampling/sampling_kl (k3 estimate of KL(sampler ‖ trainer)) — and the importance-sampling
# correction ratio's spread (sampling/importance_sampling_ratio/min|mean|max). A run already in OUT is
# not run again. The accuracies do not depend on the machine's load (a seed gives the same figures),
# but they do on the code: a change to the decode graphs' rounding alone moves a seed's trajectory
# (issue 45: grpo q4 seed 1 0.854 on main 3753d71, 0.991 after 7321616), so each run's commit is kept
# in OUT/M-D-S.commit (git's HEAD, "+dirty" with uncommitted changes; DTYPE_TABLE_COMMIT names it
# where there is no git, e.g. a `git archive` snapshot) and the table says which commits it mixes.
# The CLI runs the sources (bin/prefzoo.mjs through tsx): do not edit them while a table runs.
#
#   scripts/bench/dtype-table.sh [OUT] [DTYPES] [METHODS] [SEEDS]
#     defaults: tmp/dtype-table "f32 q8 q4" "grpo tools" "0 1 2 3 4 5 6 7 8 9"
#     a DTYPE q4bN / q8bN adds --param rollout_block_size=N (q4b16: q4 in blocks of 16)
#   nice -n 10 scripts/bench/dtype-table.sh tmp/dt "q4" > tmp/dt.md 2>&1 &
#   scripts/bench/dtype-table.sh tmp/dt "f32 q8 q4" "grpo tools" ""     (only prints what OUT holds)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tmp/dtype-table}
dtypes=${2:-f32 q8 q4}
methods=${3:-grpo tools}
seeds=${4-0 1 2 3 4 5 6 7 8 9}
mkdir -p "$out"
commit=${DTYPE_TABLE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${DTYPE_TABLE_COMMIT:-}" ] && [ -n "$(git status --porcelain -- src losses 2>/dev/null)" ]; then commit="$commit+dirty"; fi
for m in $methods; do
  for d in $dtypes; do
    for s in $seeds; do
      f="$out/$m-$d-$s.json"
      [ -s "$f" ] && continue
      params=(--param "rollout_dtype=${d%%b*}")
      [[ $d == *b* ]] && params+=(--param "rollout_block_size=${d#*b}")
      /usr/bin/time -f '%U %S %e' -o "$out/$m-$d-$s.time" \
        node bin/prefzoo.mjs demo --method "$m" --seed "$s" "${params[@]}" --json -o "$out/$m-$d-$s" > "$f.tmp"
      echo "$commit" > "$out/$m-$d-$s.commit"
      mv "$f.tmp" "$f"
    done
  done
done
node - "$out" "$dtypes" $methods <<'JS'
const fs = require('node:fs');
const path = require('node:path');
const [out, dtypeList, ...methods] = process.argv.slice(2);
const dtypes = dtypeList.split(/\s+/).filter(Boolean);
const f3 = (x) => (x === undefined || Number.isNaN(x) ? '—' : x.toFixed(3));
const g2 = (x) => (x === undefined || Number.isNaN(x) ? '—' : x.toExponential(2));
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const K = 'sampling/';
for (const m of methods) {
  const runs = {};
  for (const f of fs.readdirSync(out)) {
    const hit = f.match(new RegExp(`^${m}-(\\w+)-(\\d+)\\.json$`));
    if (!hit || !dtypes.includes(hit[1])) continue;
    const r = JSON.parse(fs.readFileSync(path.join(out, f), 'utf8'));
    const rows = fs.readFileSync(path.join(r.run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l))
      .filter((x) => x.split === undefined && typeof x[`${K}sampling_logp_difference/mean`] === 'number');
    const [u, s] = fs.readFileSync(path.join(out, f.replace(/\.json$/, '.time')), 'utf8').trim().split(/\s+/).map(Number);
    const cf = path.join(out, f.replace(/\.json$/, '.commit'));
    const commit = fs.existsSync(cf) ? fs.readFileSync(cf, 'utf8').trim() : 'unrecorded';
    (runs[hit[1]] ??= {})[Number(hit[2])] = { r, rows, cpu: u + s, commit };
  }
  const have = dtypes.filter((d) => runs[d]);
  if (!have.length) continue;
  const seedList = [...new Set(have.flatMap((d) => Object.keys(runs[d]).map(Number)))].sort((a, b) => a - b);
  console.log(`\n### prefzoo demo --method ${m}: heldout_accuracy_final by rollout_dtype\n`);
  console.log(`| seed | heldout_accuracy_start | ${have.join(' | ')} |`);
  console.log(`|---|---|${have.map(() => '---').join('|')}|`);
  for (const s of seedList) {
    const start = have.map((d) => runs[d][s]?.r.heldout_accuracy_start).find((x) => x !== undefined);
    console.log(`| ${s} | ${f3(start)} | ${have.map((d) => f3(runs[d][s]?.r.heldout_accuracy_final)).join(' | ')} |`);
  }
  const fin = (d) => Object.values(runs[d]).map((x) => x.r.heldout_accuracy_final);
  for (const [name, fn] of [['min', (xs) => Math.min(...xs)], ['median', median], ['max', (xs) => Math.max(...xs)]]) {
    console.log(`| ${name} | | ${have.map((d) => f3(fn(fin(d)))).join(' | ')} |`);
  }
  console.log(`| seeds | | ${have.map((d) => fin(d).length).join(' | ')} |`);
  console.log(`| CPU s (median) | | ${have.map((d) => median(Object.values(runs[d]).map((x) => x.cpu)).toFixed(0)).join(' | ')} |`);
  // Runs of one table made from different code are not one experiment: say so.
  const commits = {};
  for (const d of have) for (const x of Object.values(runs[d])) commits[x.commit] = (commits[x.commit] ?? 0) + 1;
  const names = Object.keys(commits);
  console.log(`\n${names.length === 1 ? 'every run from commit' : '**runs from different commits**:'} ${names.map((c) => `${c} (${commits[c]})`).join(', ')}`);
  console.log(`\n### prefzoo demo --method ${m}: sampler–trainer gap over the training rows (every seed's logged rows)\n`);
  console.log('| rollout_dtype | seeds | logp difference: mean | its max (largest row) | KL (k3), mean | IS ratio: min (smallest row) | median of the rows\' means | max (largest row) |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const d of have) {
    const rows = Object.values(runs[d]).flatMap((x) => x.rows);
    const col = (k) => rows.map((x) => x[K + k]).filter((v) => typeof v === 'number');
    const kl = col('sampling_kl');
    // Runs before the metric existed (main 3753d71 and older) did not log it: say over how many seeds it is.
    const klSeeds = Object.values(runs[d]).filter((x) => x.rows.some((y) => typeof y[K + 'sampling_kl'] === 'number')).length;
    const rmin = col('importance_sampling_ratio/min'), rmean = col('importance_sampling_ratio/mean'), rmax = col('importance_sampling_ratio/max');
    console.log(`| ${d} | ${Object.keys(runs[d]).length} | ${g2(mean(col('sampling_logp_difference/mean')))} | ${g2(Math.max(...col('sampling_logp_difference/max')))} | ${kl.length ? g2(mean(kl)) + (klSeeds < Object.keys(runs[d]).length ? ` (${klSeeds} seed${klSeeds === 1 ? '' : 's'})` : '') : '—'} | ${rmin.length ? Math.min(...rmin).toFixed(4) : '—'} | ${rmean.length ? median(rmean).toFixed(4) : '—'} | ${rmax.length ? Math.max(...rmax).toFixed(4) : '—'} |`);
  }
  if (runs.f32) {
    const f = median(fin('f32'));
    console.log(`\nmedian final accuracy against f32's (${f3(f)}): ${have.filter((d) => d !== 'f32').map((d) => `${d} ${(median(fin(d)) - f >= 0 ? '+' : '')}${(median(fin(d)) - f).toFixed(3)}`).join(', ') || '—'}`);
  }
}
JS
