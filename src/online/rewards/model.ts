/**
 * `reward:DIR`: a reward model trained by `prefzoo reward-train`, r(prompt, completion), on the run's
 * device. The `reward:DIR` judge (judges.ts) compares two completions through the same scores.
 */
import type { RuntimeOptions } from '../../runtime/session.ts';
import type { Text } from '../../../datasets/schema.ts';
import { RewardModel } from '../reward-model.ts';
import { after, type RewardBatch, type RewardFunction, type RewardKind } from './reward.ts';

export class ModelReward implements RewardFunction {
  readonly name = 'reward_model';
  readonly rerunnable = true;
  readonly source: string;
  private constructor(private readonly rm: RewardModel) {
    this.source = `reward:${rm.dir}`;
  }

  static async load(dir: string, runtime?: RuntimeOptions): Promise<ModelReward> {
    return new ModelReward(await RewardModel.load(dir, runtime));
  }

  /** r(prompt, response) per item. */
  scoreTexts(items: readonly { prompt: Text; response: Text }[]): Promise<number[]> {
    return this.rm.score(items);
  }

  score({ completions, rows }: RewardBatch): Promise<number[]> {
    return this.scoreTexts(completions.map((c, i) => ({ prompt: rows[i].prompt, response: c })));
  }

  async release(): Promise<void> {
    await this.rm.release();
  }
}

export const model: RewardKind<`reward:${string}`> = {
  name: 'reward_model',
  syntax: 'reward:DIR',
  help: 'a reward model trained by `prefzoo reward-train` (a model folder with a value head): r(prompt, completion), on the run\'s device',
  matches: (spec): spec is `reward:${string}` => spec.startsWith('reward:'),
  load: async (spec, env) => [await ModelReward.load(after(spec, 'reward:'), env.runtime)],
};
