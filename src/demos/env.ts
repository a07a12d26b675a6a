/**
 * `prefzoo demo --method env`: GRPO with an environment (src/agents `Environment`) whose state
 * changes each turn: guess a secret number from 1 to 7 in 3 guesses, each wrong guess answered
 * "higher" or "lower". The secret is drawn from the episode's seed, so the G rollouts of a group
 * play the same game; the environment's reward (1 when a guess hits, else 0) is the only reward
 * (`rewards/env/mean`). Binary search (4, then 2 or 6, then the last one left) wins every game; with
 * the feedback withheld no strategy wins more than 3 games in 7 (three distinct guesses of seven).
 *
 *   1. a tiny llama warm-started by SFT (400 steps) on two kinds of rows in turn: games whose guesses
 *      are drawn at random among the numbers the feedback so far allows (the answer format, one number
 *      then the end of the turn, and what "higher" and "lower" mean; which allowed number to try is
 *      uniform, so the games hold no strategy, and the secret is never told: the counterpart of the
 *      tools demo's warm start, which answers with whatever its randomly-keyed call returned), and a
 *      few distinct numbers of 1–7 said back in order ("5 2 7" → "2 5 7": the number sense a
 *      pretrained model has and a random one lacks). The starting policy wins about 0.6 of games;
 *      GRPO has to find binary search — 4 first, then the middle of what is left
 *   2. `grpo --env` on the game (the multi-turn rollout on the generation session, agent-rollout.ts),
 *      8 games × 16 rollouts a step, loss_type=grpo: a lost game takes all three guesses and a won one
 *      may end sooner, so a token-level loss (dapo) gives the losing rollouts most of the weight and
 *      drains probability from the sampled tokens (measured: entropy 1.0 → 3+ nats within 90 steps)
 *   3. held-out accuracy: the share of games won among 8 rollouts (temperature 1) per held-out episode
 *      seed, of the starting and the trained policy; and the ceiling: the trained policy playing the
 *      same games with every wrong guess answered "no" instead of "higher" or "lower"
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Example } from '../../datasets/examples.ts';
import type { Message } from '../chat.ts';
import { environmentFrom } from '../agents/env.ts';
import type { Environment, EnvironmentFactory } from '../agents/types.ts';
import { initModelFolder } from '../models/init.ts';
import { SeededRandom } from '../random.ts';
import type { TrainConfig } from '../train/config.ts';
import { SILENT } from '../progress.ts';
import { cpuLaps, EVAL_SAMPLES, evaluateAgent, finishAgentDemo, GRPO_BASE, WARM_START_BASE, warmStart, type AgentDemoOptions, type AgentDemoResult } from './agent-shared.ts';
import { grpo, type AgentRolloutInfo, type AgentRolloutSettings } from '../online/grpo/index.ts';
import { readPromptRows } from '../online/prompts.ts';
import type { RewardFunction } from '../online/rewards/index.ts';

/** The secret is 1…HIGHEST; a game allows GUESSES guesses. */
export const HIGHEST = 7;
export const GUESSES = 3;
const PROMPT = `guess 1-${HIGHEST}`;

/**
 * The game as an environment factory. `feedback: false` answers every wrong guess "no" (the
 * ceiling's evaluation); a turn that is not one number from 1 to HIGHEST is a wasted guess.
 */
export function guessingGame(feedback = true): EnvironmentFactory {
  return (): Environment => {
    let secret = 0;
    let guesses = 0;
    let won = false;
    return {
      reset(_row, { seed }) {
        secret = 1 + new SeededRandom(seed).int(HIGHEST);
        return {};
      },
      step({ text }) {
        guesses++;
        const m = /^\s*(\d+)\s*$/.exec(text);
        const guess = m ? Number(m[1]) : NaN;
        if (guess === secret) {
          won = true;
          return { messages: [], reward: 1, done: true };
        }
        if (guesses >= GUESSES) return { messages: [], reward: 0, done: true };
        const say = !feedback || !(guess >= 1 && guess <= HIGHEST) ? 'no' : guess < secret ? 'higher' : 'lower';
        return { messages: [{ role: 'user', content: say }], done: false };
      },
      reward: () => (won ? 1 : 0),
    };
  };
}

/** The environment's reward as a reward function, for the demo's own evaluations (as GRPO logs it: rewards/env/mean). */
const ENV_REWARD: RewardFunction = {
  name: 'env',
  rerunnable: true,
  score: ({ rollouts }) => (rollouts ?? []).map((r) => (r as unknown as AgentRolloutInfo).env_reward ?? null),
};

/**
 * The warm start: SFT on games that read the feedback (warmStartGame) and on numbers put in order.
 * 400 steps, not 200: after 200 the starting policy still often guessed outside what the feedback
 * allowed (it won 0.54 and 0.58 of games on seeds 0 and 2, GRPO then reaching 0.76 and 0.74); after
 * 400 it wins 0.61 on both, and GRPO reaches 0.94 and 0.93 (4 × 32; docs/agents.md).
 */
const WARM_START: Partial<TrainConfig> = { ...WARM_START_BASE, max_steps: 400, max_length: 80, max_prompt_length: 32 };
const WARM_ROWS = 1000;

/**
 * GRPO: 8 games × 16 rollouts a step, 240 steps (what fits in the 2-minute budget). From this warm
 * start 8 games a step found binary search more often than 4 × 32 (docs/agents.md): the first guess,
 * whose advantage is the smallest (4 against 3 or 5: 7 wins in 7 against 6 in 7), is learnt from twice
 * as many secrets a step.
 */
const GRPO_CONFIG: Partial<TrainConfig> = { ...GRPO_BASE, learning_rate: 2e-3, max_steps: 240 };
/** Rollouts per game in training (a group); the held-out evaluation plays EVAL_SAMPLES per game. */
const G = 16;
const ROLLOUT: AgentRolloutSettings = { temperature: 1, top_p: 1, top_k: 0, max_completion_length: 64, max_turns: GUESSES, max_tool_calling_iterations: 0, max_tool_response_tokens: 16 };
const GRPO_PARAMS = [`num_generations=${G}`, `max_completion_length=${ROLLOUT.max_completion_length}`, `max_turns=${ROLLOUT.max_turns}`, 'temperature=1', 'beta=0.04', 'loss_type=grpo'];
const TRAIN_PROMPTS = 2000;
const HELDOUT_PROMPTS = 64;

/**
 * One warm-start game against `secret`, as the conversation after the prompt: each guess drawn at
 * random among the numbers the feedback so far allows (the first among all seven), so the game reads
 * the feedback and holds no strategy (which of the allowed numbers to try is uniform) nor the secret.
 */
export function warmStartGame(r: SeededRandom, secret: number): Message[] {
  const out: Message[] = [];
  let lo = 1;
  let hi = HIGHEST;
  for (let g = 0; g < GUESSES; g++) {
    const guess = lo + r.int(hi - lo + 1);
    out.push({ role: 'assistant', content: String(guess) });
    if (guess === secret || g === GUESSES - 1) break;
    if (guess < secret) lo = guess + 1;
    else hi = guess - 1;
    out.push({ role: 'user', content: guess < secret ? 'higher' : 'lower' });
  }
  return out;
}

export async function runEnvDemo(o: AgentDemoOptions): Promise<AgentDemoResult> {
  const t0 = Date.now();
  const log = (o.reporter ?? SILENT).info;
  const dir = o.out ?? mkdtempSync(join(tmpdir(), 'prefzoo-demo-env-'));
  mkdirSync(dir, { recursive: true });
  const init = initModelFolder(join(dir, 'model'), 'llama', 'tiny', o.seed);
  log(`demo: tiny llama (${init.parameters.toLocaleString('en-US')} parameters); method grpo with the environment "guess 1–${HIGHEST} in ${GUESSES}"`);

  // Every prompt is the same; what differs is the episode's seed, hence the secret.
  const jsonl = (file: string, n: number) => {
    writeFileSync(file, Array.from({ length: n }, () => JSON.stringify({ prompt: PROMPT }) + '\n').join(''));
    return file;
  };
  const promptsFile = jsonl(join(dir, 'prompts.jsonl'), TRAIN_PROMPTS);
  const heldoutFile = jsonl(join(dir, 'heldout.jsonl'), o.heldoutPrompts ?? HELDOUT_PROMPTS);

  // π_0, two kinds of rows in turn, neither holding a strategy nor a secret: games whose guesses are
  // drawn among the numbers the feedback allows (the answer format and the feedback's meaning); and two
  // to five distinct numbers of 1–7 said back in order (generic number sense, which a random model lacks).
  const rand = new SeededRandom(o.seed + 17);
  const prompt: Message[] = [{ role: 'user', content: PROMPT }];
  const warm: Example[] = Array.from({ length: WARM_ROWS }, (_, i) => {
    if (i % 2 === 1) {
      const numbers = rand.shuffle(Array.from({ length: HIGHEST }, (_, k) => k + 1)).slice(0, 2 + rand.int(4));
      return { prompt: [{ role: 'user', content: numbers.join(' ') }], responses: [[...numbers].sort((a, b) => a - b).join(' ')] };
    }
    const game = warmStartGame(rand, 1 + rand.int(HIGHEST));
    return { prompt, responses: [game] };
  });
  const lap = cpuLaps(log);
  const start = await warmStart(dir, 'games.jsonl', warm, WARM_START, o);

  lap('warm start');
  const run = join(dir, 'grpo');
  const r = await grpo({
    model: start.finalDir, prompts: promptsFile, rewards: [], env: guessingGame(), out: run, overwrite: true,
    base: { ...GRPO_CONFIG, seed: o.seed }, params: [...GRPO_PARAMS, ...(o.params ?? [])], reporter: o.reporter,
  });

  lap('grpo');
  // Start, final and ceiling: the same held-out episode seeds (secrets) and sampler; only the model or the feedback differs.
  const held = await readPromptRows(heldoutFile);
  const evalWith = (model: string, feedback: boolean) =>
    evaluateAgent(model, held, ROLLOUT, { executor: () => null, env: environmentFrom(guessingGame(feedback), feedback ? 'guess' : 'guess without feedback') }, ENV_REWARD, { n: EVAL_SAMPLES, seed: o.seed * 31 + 7 });
  const before = await evalWith(start.finalDir, true);
  const after = await evalWith(r.finalDir, true);
  const ceiling = await evalWith(r.finalDir, false);

  lap('evaluations');
  return finishAgentDemo('env', { before, after, ceiling }, { heldoutPrompts: held.length, steps: r.steps, t0, run, heldout: `${held.length} held-out games × ${EVAL_SAMPLES} rollouts at temperature 1 (guess 1–${HIGHEST} in ${GUESSES} with higher/lower; reward: the environment's); the ceiling: the trained policy with every wrong guess answered "no"` });
}
