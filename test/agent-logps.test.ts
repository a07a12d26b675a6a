/**
 * Multi-turn GRPO trains what it sampled (src/online/grpo/agent-rollout.ts → round.ts → graph.ts):
 * a tiny Llama (no padded vocabulary rows, so the sampler's and the trainer's softmax run over the
 * same ids) taught the env demo's answer format by a few GRPO steps on scripted games, then
 *
 * - the real multi-turn rollout on the env demo's game (guess 1–7, higher/lower) gives the ids a
 *   generation session drew, turn by turn, from the same random streams (a replica of its loop that
 *   asks the session for each drawn token's log-probability): no re-tokenized turn, no reordered row;
 * - the loss mask is 1 on exactly the sampled tokens (each turn's end-of-turn id included), 0 on the
 *   bridges (the game's feedback and the next generation prompt), and each completion belongs to its
 *   own group: the environment of completion j was reset with the episode seed of prompt ⌊j/G⌋;
 * - on those masked positions the training graph's per-token log-probs (round.ts's old log-probs,
 *   the reference scorer's, and the eval graph under the micro-batch's own mask) equal the sampler's
 *   to 1e-5;
 * - one update with a positive advantage on one completion only raises that completion's log-prob.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder, initModelFromConfig } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { chatPromptIds } from '../src/tokenize/conversation.ts';
import { Decoder, GenerationSession } from '../src/models/generate.ts';
import { sampleRandom, samplingOptions } from '../src/models/sampling.ts';
import { environmentFrom } from '../src/agents/env.ts';
import { episodeSeed } from '../src/agents/seeds.ts';
import type { EnvironmentFactory } from '../src/agents/types.ts';
import type { Message } from '../src/chat.ts';
import { agentRollout, Episode, type AgentRolloutInfo, type AgentRolloutSettings } from '../src/online/grpo/agent-rollout.ts';
import type { Completion } from '../src/online/grpo/rollout.ts';
import { grpoLoss, type GrpoSettings } from '../src/online/grpo/settings.ts';
import { columnsOf, grpoSpec, type Columns } from '../src/online/grpo/graph.ts';
import type { GrpoParams } from '../losses/grpo.ts';
import { microBatches, roundLogps, type GrpoRound } from '../src/online/grpo/round.ts';
import { guessingGame } from '../src/demos/env.ts';
import { ReferenceScorer } from '../src/online/reference.ts';
import { resolveConfig } from '../src/train/config.ts';
import { buildArtifacts } from '../src/artifacts/build.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import type { ModelConfig } from '../src/models/config.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { SeededRandom } from '../src/random.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-agent-logps-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const S: AgentRolloutSettings = { temperature: 1, top_p: 1, top_k: 0, max_completion_length: 48, max_turns: 3, max_tool_calling_iterations: 0, max_tool_response_tokens: 16 };
const P = 3;
const G = 4;
const SEED = 4242;
const STEP = 3;
const PROMPT = 'guess 1-7';
const rows = Array.from({ length: P }, (_, i) => ({ prompt: PROMPT, row: { prompt: PROMPT }, at: `games.jsonl:${i + 1}` }));

/** The env demo's game, its reward the episode seed it was reset with (which group a completion played in). */
const seedGame: EnvironmentFactory = async () => {
  const game = await guessingGame(true)();
  let seed = -1;
  return {
    reset: (row, o) => ((seed = o.seed), game.reset(row, o)),
    step: (a) => game.step(a),
    reward: () => seed,
  };
};

let tok: LoadedTokenizer;
let config: ModelConfig;
let art: TrainingArtifacts;
let batching: { batchSize: number; padTo: number; padId: number };
/** The columns the graph reads (dapo's num_items_in_batch), and with the old and reference log-probs asked for. */
let cols: Columns;
let scored: Columns;
const weights = () => new Map<string, FloatTensor>(art.manifest.params.map((p) => [p.name, { shape: p.shape, data: Float32Array.from(art.param(p.name) as Float32Array) }]));

/** Completions as GRPO would train them: advantages given, every completion counted. */
function roundOf(cs: readonly Completion[], advantages: number[]): GrpoRound {
  return { promptIds: cs.map((c) => c.promptIds), ids: cs.map((c) => c.ids), counted: cs.map(() => 1), masks: cs.map((c) => c.lossMask), advantages, old: null, ref: null, sampling: null, metrics: {} };
}

beforeAll(async () => {
  // The tiny preset pads the embedding to a multiple of 64; without the padding the trainer's
  // softmax and the sampler's (over the tokenizer's ids) are over the same vocabulary.
  initModelFolder(join(dir, 'preset'), 'llama', 'tiny', 5);
  const raw = JSON.parse(readFileSync(join(dir, 'preset', 'config.json'), 'utf8')) as Record<string, unknown>;
  raw.vocab_size = loadTokenizer(join(dir, 'preset')).vocabSize;
  writeFileSync(join(dir, 'config.json'), JSON.stringify(raw));
  initModelFromConfig(join(dir, 'model'), raw, join(dir, 'config.json'), 5);
  tok = loadTokenizer(join(dir, 'model'));
  const m = loadModel(join(dir, 'model'));
  config = m.config;
  const { config: train, lossParams, own } = resolveConfig({ command: 'grpo', params: [`max_completion_length=${S.max_completion_length}`, 'temperature=1', 'vllm_importance_sampling_correction=false'], base: { batch_size: 8, pad_to_multiple_of: 8, learning_rate: 1e-2, max_grad_norm: 1, weight_decay: 0 } });
  const s = own as unknown as GrpoSettings;
  const loss = grpoLoss(lossParams, s);
  // The scripted warm-up's completions have no sampler log-probs: the correction (on by default) is off here;
  // the sampler's log-probs are compared with the trainer's directly below.
  cols = columnsOf(loss.terms[0].params as GrpoParams, s);
  scored = { ...cols, old: true, ref: true };
  buildArtifacts(grpoSpec({ config, init: m.weights, lora: null, train, loss, settings: s }), join(dir, 'art'));
  art = await TrainingArtifacts.load(join(dir, 'art'));
  batching = { batchSize: 8, padTo: 8, padId: tok.padId ?? 0 };

  // The answer format (a digit, then the end of the turn), taught by GRPO itself: scripted games of
  // random guesses, advantage 1 (with old = live log-probs, the policy term's gradient is SFT's).
  const rand = new SeededRandom(9);
  const env = environmentFrom(guessingGame(true), 'guess');
  const END = tok.tokenToId('<|im_end|>')!;
  for (let step = 0; step < 40; step++) {
    const cs: Completion[] = [];
    for (let k = 0; k < 8; k++) {
      const e = await env.open();
      const start: Message[] = [{ role: 'user', content: PROMPT }, ...(await e.reset({}, rand.int(1000)))];
      const ep = new Episode(tok, S, null, [], start, { executor: null, env: e, where: { row: {}, seed: 0, step, rollout: k, at: 'scripted' } });
      while (await ep.take([...tok.encode(String(1 + rand.int(7)), { addSpecialTokens: false }), END], true));
      cs.push({ prompt: 0, promptIds: chatPromptIds(tok, start), ids: ep.ids, lossMask: ep.lossMask, text: '', stopped: true, info: {} });
    }
    const [mb] = microBatches(roundOf(cs, cs.map(() => 1)), cols, batching);
    await art.trainStep(mb.feeds, { lr: 1e-2 });
  }
}, 60_000);

afterAll(async () => {
  await art?.release();
});

describe('multi-turn GRPO trains what it sampled', () => {
  it('sampled ids, masks, groups and per-token log-probs line up from the rollout to the training graph', async () => {
    const policy = await Decoder.create(config, weights());
    const env = environmentFrom(seedGame, 'seed game');
    const real = await agentRollout(S, { executor: () => null, env })({ tok, policy }, { prompts: rows, n: G, seed: SEED, step: STEP });

    // The same rollout, turn by turn on a session that reports each drawn token's log-prob.
    const session = GenerationSession.open(policy, { ...samplingOptions({ temperature: 1, topK: 0, topP: 1 }), logprobs: true, stopIds: tok.stopIds, padId: tok.padId ?? 0, vocabLimit: tok.vocabSize, maxBatch: P * G, slots: 128 });
    const drawn = await Promise.all(
      Array.from({ length: P * G }, async (_, j) => {
        const i = Math.floor(j / G);
        const e = await env.open();
        const start: Message[] = [{ role: 'user', content: PROMPT }, ...(await e.reset({}, episodeSeed(SEED, STEP, i)))];
        const row = session.start(chatPromptIds(tok, start), sampleRandom(SEED, i, j % G), S.max_completion_length);
        const ep = new Episode(tok, S, null, [], start, { executor: null, env: e, where: { row: {}, seed: 0, step: STEP, rollout: j, at: 'replica' } });
        const ids: number[] = [];
        const logps: number[] = [];
        const sampled: number[] = [];
        for (;;) {
          const seg = await row.generate({ maxNewTokens: ep.budget });
          sampled.push(...seg.ids.map((_, k) => ids.length + k));
          ids.push(...seg.ids);
          logps.push(...seg.logps!);
          const next = await ep.take(seg.ids, seg.stop === 'stop-id');
          if (!next) break;
          ids.push(...next);
          logps.push(...next.map(() => NaN));
          row.extend(next);
        }
        row.close();
        return { ids, logps, sampled, turns: ep.turns };
      }),
    );
    await session.close();

    const turns = real.map((c) => (c.info as unknown as AgentRolloutInfo).turns);
    expect(Math.max(...turns)).toBeGreaterThan(1); // multi-turn rollouts, bridges inside them
    real.forEach((c, j) => {
      expect(c.prompt).toBe(Math.floor(j / G));
      // What the trainer gets is what the session drew, bridges where the rollout extended the row.
      expect(c.ids).toEqual(drawn[j].ids);
      expect(c.lossMask.flatMap((m, t) => (m === 1 ? [t] : []))).toEqual(drawn[j].sampled);
      // Each sampled turn ends on its end-of-turn id; the bridge that follows is masked.
      const info = c.info as unknown as AgentRolloutInfo;
      expect(c.lossMask.filter((m, t) => m === 1 && tok.stopIds.includes(c.ids[t])).length).toBe(info.turns);
      // Its group: the environment of completion j was reset with prompt ⌊j/G⌋'s episode seed.
      expect(info.env_reward).toBe(episodeSeed(SEED, STEP, Math.floor(j / G)));
    });

    // The training graph's log-probs at the sampled positions: the round's old ones (eval graph, full
    // completion mask), the reference scorer's (starting weights = these weights) and the eval graph
    // under the micro-batch's own loss mask (bridges 0), against the sampler's.
    const round = roundOf(real, real.map((_, j) => j % 2));
    const ref = await ReferenceScorer.create(config, weights(), {}, { temperature: 1 });
    await roundLogps(round, scored, batching, art, ref);
    await ref.release();
    let worst = 0;
    let counted = 0;
    real.forEach((c, j) => {
      for (const t of drawn[j].sampled) {
        worst = Math.max(worst, Math.abs(round.old![j][t] - drawn[j].logps[t]), Math.abs(round.ref![j][t] - drawn[j].logps[t]));
        counted++;
      }
    });
    const placed = microBatches(round, scored, batching);
    for (const [b, mb] of placed.entries()) {
      const lp = (await art.evaluate({ input_ids: mb.feeds.input_ids, attention_mask: mb.feeds.attention_mask, loss_mask: mb.feeds.loss_mask })).token_logps.data as Float32Array;
      const T = (mb.feeds.loss_mask.dims as number[])[1];
      const lm = mb.feeds.loss_mask.data as Float32Array;
      const adv = mb.feeds.advantages.data as Float32Array;
      for (let r = 0; r < adv.length; r++) {
        const j = b * batching.batchSize + r;
        expect(adv[r]).toBe(round.advantages[j]);
        const at = Array.from({ length: T }, (_, t) => t).filter((t) => lm[r * T + t] > 0);
        expect(at.length).toBe(drawn[j].sampled.length);
        at.forEach((t, k) => (worst = Math.max(worst, Math.abs(lp[r * T + t] - drawn[j].logps[drawn[j].sampled[k]]))));
      }
    }
    expect(counted).toBeGreaterThan(real.length * 2);
    expect(worst).toBeLessThan(1e-5);

    // One update, advantage 1 on completion 0 alone: its log-prob rises.
    const own = (lp: number[]) => drawn[0].sampled.reduce((a, t) => a + lp[t], 0);
    const before = own(round.old![0]);
    const one = roundOf(real, real.map((_, j) => (j === 0 ? 1 : 0)));
    // (Completion 0 is in the first micro-batch; the others' advantage 0 gives them no gradient.)
    await art.trainStep(microBatches(one, cols, batching)[0].feeds, { lr: 1e-3 });
    await roundLogps(one, { ...cols, old: true }, batching, art, null);
    expect(own(one.old![0])).toBeGreaterThan(before);
  }, 60_000);
});
