#!/usr/bin/env node
// The env demo's game (guess 1–7 in 3, higher/lower) learnt by a tabular softmax policy with
// GRPO-style policy gradient: one table of 7 logits per history (own guesses and the feedback), all
// zero at the start (the warm start's uniform guesses), groups of G games that share a secret, the
// advantage (R − mean) / std within the group, the gradient of each turn's log-probability averaged
// over the rollout's turns and the step's rollouts, gradient ascent (or Adam) on the logits. No network:
// this isolates what the objective and the sampling do from what a model can represent.
// Prints, per seed, the held-out win rate at temperature 1 and greedily, and the first guess's
// probabilities; then how many seeds found binary search (greedy win rate 1).
//   node scripts/analysis/guess-tabular.mjs                 (G=32 P=4 STEPS=400 OPT=sgd LR=1 SEEDS=10)
//   OPT=adam G=8 P=16 STEPS=240 node scripts/analysis/guess-tabular.mjs   (Adam on the logits, LR 0.05)
//   STARTS=0.34,0.33,0.33 node scripts/analysis/guess-tabular.mjs   (exploring starts: the game
//   begins after 0, 1 or 2 wrong guesses made for the player, with these probabilities)
//   START=consistent node scripts/analysis/guess-tabular.mjs   (the table starts where a warm start on
//   games of guesses drawn among the numbers the feedback allows leaves the policy: logit 3 on each such
//   number, 0 on the others, about 95% of each guess consistent; START=uniform, the default, is all 0)
//   WEIGHT=1 LR=0.1 node scripts/analysis/guess-tabular.mjs   (each turn's gradient weighted
//   (n_h / N)^-WEIGHT, n_h the step's turns from its history and N the step's rollouts: every history
//   visited pushes about as hard, however often the step visits it; the first turn keeps weight 1)
if (process.argv.includes('--help') || process.argv.includes('-h')) {
  const text = (await import('node:fs')).readFileSync(new URL(import.meta.url), 'utf8');
  console.log(text.split('\n').slice(1).filter((l) => l.startsWith('//')).map((l) => l.slice(3)).join('\n'));
  console.log('Settings (environment): G, P, STEPS, SEEDS, OPT (sgd | adam), LR, STARTS, WEIGHT, START (uniform | consistent).');
  process.exit(0);
}
const num = (k, d) => (process.env[k] === undefined ? d : Number(process.env[k]));
const G = num('G', 32), P = num('P', 4), STEPS = num('STEPS', 400), SEEDS = num('SEEDS', 10);
// OPT=sgd: plain gradient ascent on the logits (LR default 1); OPT=adam: Adam on them (LR default 0.05, β 0.9 / 0.999).
const OPT = process.env.OPT ?? 'sgd';
const LR = num('LR', OPT === 'adam' ? 0.05 : 1);
// STARTS: 'p0,p1,p2' for the whole run, or phases 'p0,p1,p2@STEP;…' (each until its STEP, the last to the end).
const PHASES = (process.env.STARTS ?? '1,0,0').split(';').map((x) => {
  const [p, until] = x.split('@');
  return { p: p.split(',').map(Number), until: until === undefined ? Infinity : Number(until) };
});
const startsAt = (step) => PHASES.find((ph) => step < ph.until)?.p ?? PHASES.at(-1).p;
const HIGHEST = 7, GUESSES = 3;
const WEIGHT = num('WEIGHT', 0);
const START = process.env.START ?? 'uniform';
if (START !== 'uniform' && START !== 'consistent') throw new Error(`START=${START}: uniform or consistent`);
/** The starting logits of a history: 0 everywhere (uniform), or 3 on the numbers its feedback still allows. */
function startLogits(h) {
  const l = new Float64Array(HIGHEST);
  if (START === 'uniform') return l;
  let lo = 1, hi = HIGHEST;
  for (const t of h ? h.split('|') : []) {
    const g = Number(t.slice(0, -1));
    if (t.endsWith('H')) lo = Math.max(lo, g + 1);
    else hi = Math.min(hi, g - 1);
  }
  for (let i = lo; i <= hi; i++) l[i - 1] = 3;
  return l;
}

function run(seed) {
  let s = (seed * 2654435761 + 1) >>> 0;
  const rnd = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296;
  const table = new Map();
  const moments = new Map();
  const logits = (h) => table.get(h) ?? table.set(h, startLogits(h)).get(h);
  const probs = (h, T = 1) => {
    const l = logits(h);
    const m = Math.max(...l);
    const e = l.map((x) => Math.exp((x - m) / T));
    const z = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / z);
  };
  const draw = (p) => {
    let u = rnd(), c = 0;
    for (let i = 0; i < p.length; i++) if (u < (c += p[i])) return i;
    return p.length - 1;
  };
  const feedback = (g, secret) => (g < secret ? 'H' : 'L');
  // One game from the history `pre` (guesses made for the player): the turns played and the reward.
  function play(secret, T, pre = []) {
    let h = pre.map((g) => `${g}${feedback(g, secret)}`).join('|');
    const turns = [];
    for (let t = pre.length; t < GUESSES; t++) {
      const a = draw(probs(h, T));
      turns.push({ h, a });
      const g = a + 1;
      if (g === secret) return { turns, R: 1 };
      h += (h ? '|' : '') + `${g}${feedback(g, secret)}`;
    }
    return { turns, R: 0 };
  }
  const accuracy = (T) => {
    let won = 0;
    for (let k = 0; k < 2000; k++) won += play(1 + Math.floor(rnd() * HIGHEST), T).R;
    return won / 2000;
  };
  for (let step = 0; step < STEPS; step++) {
    const grads = new Map();
    const played = [];
    for (let p = 0; p < P; p++) {
      const secret = 1 + Math.floor(rnd() * HIGHEST);
      const u = rnd();
      const STARTS = startsAt(step);
      const made = u < STARTS[1] ? 1 : u < STARTS[1] + STARTS[2] ? 2 : 0;
      const wrong = [...Array(HIGHEST).keys()].map((k) => k + 1).filter((x) => x !== secret);
      const pre = [];
      for (let k = 0; k < made; k++) pre.push(wrong.splice(Math.floor(rnd() * wrong.length), 1)[0]);
      const games = Array.from({ length: G }, () => play(secret, 1, pre));
      const R = games.map((g) => g.R);
      const mean = R.reduce((a, b) => a + b, 0) / G;
      const std = Math.sqrt(R.reduce((a, b) => a + (b - mean) ** 2, 0) / (G - 1));
      for (const g of games) played.push({ g, A: std > 1e-6 ? (g.R - mean) / (std + 1e-4) : 0 });
    }
    // n_h: how many of the step's turns start from history h (WEIGHT only).
    const visits = new Map();
    for (const { g } of played) for (const { h } of g.turns) visits.set(h, (visits.get(h) ?? 0) + 1);
    for (const { g, A } of played) {
      for (const { h, a } of g.turns) {
        const w = WEIGHT === 0 ? 1 : (visits.get(h) / (G * P)) ** -WEIGHT;
        const pr = probs(h);
        const acc = grads.get(h) ?? grads.set(h, new Float64Array(HIGHEST)).get(h);
        for (let i = 0; i < HIGHEST; i++) acc[i] += (w * A * ((i === a ? 1 : 0) - pr[i])) / g.turns.length / (G * P);
      }
    }
    for (const [h, g] of grads) {
      const l = logits(h);
      if (OPT === 'adam') {
        const st = moments.get(h) ?? moments.set(h, { m: new Float64Array(HIGHEST), v: new Float64Array(HIGHEST), t: 0 }).get(h);
        st.t++;
        for (let i = 0; i < HIGHEST; i++) {
          st.m[i] = 0.9 * st.m[i] + 0.1 * g[i];
          st.v[i] = 0.999 * st.v[i] + 0.001 * g[i] * g[i];
          l[i] += (LR * (st.m[i] / (1 - 0.9 ** st.t))) / (Math.sqrt(st.v[i] / (1 - 0.999 ** st.t)) + 1e-8);
        }
      } else for (let i = 0; i < HIGHEST; i++) l[i] += LR * HIGHEST * g[i];
    }
  }
  return { t1: accuracy(1), greedy: accuracy(0.02), first: Array.from(probs("")) };
}

const out = [];
for (let seed = 0; seed < SEEDS; seed++) {
  const r = run(seed);
  out.push(r);
  console.log(`seed ${seed}: win rate ${r.t1.toFixed(3)} at temperature 1, ${r.greedy.toFixed(3)} greedily; first guess ${r.first.map((x, i) => `${i + 1}:${x.toFixed(2)}`).join(' ')}`);
}
const sorted = out.map((r) => r.t1).sort((a, b) => a - b);
const median = (sorted[(SEEDS - 1) >> 1] + sorted[SEEDS >> 1]) / 2;
console.log(`G=${G} P=${P} steps=${STEPS} ${OPT} lr=${LR} start=${START} starts=${process.env.STARTS ?? '1,0,0'} weight=${WEIGHT}: binary search (greedy ≥ 0.99) on ${out.filter((r) => r.greedy >= 0.99).length} of ${SEEDS} seeds; temperature-1 win rate min ${sorted[0].toFixed(3)}, median ${median.toFixed(3)}`);
