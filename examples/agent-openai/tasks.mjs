// Writes N task rows (JSON lines, to stdout) for agent.mjs: a key a–h, its own random table of eight
// digits, and the answer, the table's digit for that key. The same SEED gives the same rows.
//
//   node examples/agent-openai/tasks.mjs 2000 [SEED] > tasks.jsonl
const KEYS = 'abcdefgh';
const [n, seed = '0'] = process.argv.slice(2);
if (!/^\d+$/.test(n ?? '') || !/^\d+$/.test(seed)) {
  process.stderr.write('usage: node tasks.mjs N [SEED] > tasks.jsonl\n');
  process.exit(2);
}
// A small linear congruential generator (Numerical Recipes' constants), seeded.
let state = (Number(seed) * 2654435761 + 1) >>> 0;
const draw = (m) => {
  state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
  return Math.floor((state / 2 ** 32) * m);
};
const lines = [];
for (let i = 0; i < Number(n); i++) {
  const table = Array.from({ length: KEYS.length }, () => String(draw(10))).join('');
  const k = draw(KEYS.length);
  lines.push(JSON.stringify({ prompt: `${KEYS[k]}?`, answer: table[k], table }));
}
process.stdout.write(lines.map((l) => l + '\n').join(''));
