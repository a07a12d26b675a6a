/**
 * Where the distill demo's forward KL puts its signal (`node --import tsx scripts/bench/distill-probe.ts
 * DEMO_DIR [STUDENT] [N]`): over the first N (default 100) training prompts of a distill demo folder
 * (DEMO_DIR/prompts.jsonl, the teacher DEMO_DIR/teacher/final, the student DEMO_DIR/start/final
 * unless STUDENT is given), with full-vocabulary distributions at temperature 1:
 * position 1 (the digit): KL(teacher ‖ student) and ‖p_s − p_t‖, the forward KL's gradient on the
 * student's logits; position 2 (after each digit the student gives ≥ 0.001, weighted by its
 * probability): the same, and both models' mass on the end token. One line.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { GenerationSession } from '../../src/models/generate.ts';
import { ModelSampler } from '../../src/online/policy.ts';
import { promptIds } from '../../src/online/prompts.ts';
import { SeededRandom } from '../../src/random.ts';

const [dir, studentArg, nArg] = process.argv.slice(2);
if (!dir) throw new Error('usage: distill-probe.ts DEMO_DIR [STUDENT] [N]');
const prompts = readFileSync(join(dir, 'prompts.jsonl'), 'utf8').trim().split('\n').slice(0, Number(nArg ?? 100)).map((l) => JSON.parse(l).prompt as string);
const s = await ModelSampler.load(studentArg || join(dir, 'start', 'final'));
const t = await ModelSampler.load(join(dir, 'teacher', 'final'));
const studentSession = GenerationSession.open(s.decoder);
const teacherSession = GenerationSession.open(t.decoder);
const rng = new SeededRandom(1); // logits only: nothing is drawn
const softmax = (l: Float32Array): number[] => {
  let m = -Infinity;
  for (const x of l) m = Math.max(m, x);
  const e = Array.from(l, (x) => Math.exp(x - m));
  const z = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / z);
};
const kl = (p: number[], q: number[]) => p.reduce((a, pi, i) => a + (pi > 0 ? pi * (Math.log(pi) - Math.log(Math.max(q[i], 1e-300))) : 0), 0);
const gradNorm = (ps: number[], pt: number[]) => Math.sqrt(ps.reduce((a, x, i) => a + (x - pt[i]) ** 2, 0));
/** The next token's distribution after the prompt and `more`. */
const dist = async (session: GenerationSession, ids: number[], more: number[]) => {
  const row = session.start(ids, rng, 2);
  if (more.length) row.extend(more);
  const p = softmax(await row.logits());
  row.close();
  return p;
};
const endId = s.tok.eosId;
if (endId === null) throw new Error(`${dir}: the student's tokenizer has no end id`);
const sum = { right: 0, kl1: 0, grad1: 0, kl2: 0, grad2: 0, teacherEnd: 0, studentEnd: 0 };
for (const p of prompts) {
  const ids = promptIds(s.tok, p);
  const ps = await dist(studentSession, ids, []);
  const pt = await dist(teacherSession, ids, []);
  sum.right += ps[s.tok.encode(p[p.length - 2], { addSpecialTokens: false })[0]];
  sum.kl1 += kl(pt, ps);
  sum.grad1 += gradNorm(ps, pt);
  for (let d = 0; d < ps.length; d++) {
    if (ps[d] < 1e-3) continue;
    const qs = await dist(studentSession, ids, [d]);
    const qt = await dist(teacherSession, ids, [d]);
    sum.kl2 += ps[d] * kl(qt, qs);
    sum.grad2 += ps[d] * gradNorm(qs, qt);
    sum.teacherEnd += ps[d] * qt[endId];
    sum.studentEnd += ps[d] * qs[endId];
  }
}
const m = (x: number) => (x / prompts.length).toFixed(3);
console.log(`${prompts.length} prompts; student's mass on the right digit ${m(sum.right)}; position 1: KL(t‖s) ${m(sum.kl1)}, ‖p_s − p_t‖ ${m(sum.grad1)}; position 2: KL(t‖s) ${m(sum.kl2)}, ‖p_s − p_t‖ ${m(sum.grad2)}, end mass teacher ${m(sum.teacherEnd)} student ${m(sum.studentEnd)}`);
studentSession.close();
teacherSession.close();
await s.release();
await t.release();
