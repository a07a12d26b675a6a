/**
 * GRPO's settings: its own table (beside the trainer's and the `grpo` loss's parameters), the trainer
 * settings it honours and its defaults of them. Parsing, validation, `prefzoo grpo --help` and
 * docs/settings.md all come from this declaration.
 */
import { UserError } from '../../errors.ts';
import { resolveLoss, type BoundLoss } from '../../../losses/index.ts';
import { GRPO_HONOURS, GRPO_SETTINGS, type SettingsOf } from '../../train/settings.ts';

export { GRPO_SETTINGS, GRPO_HONOURS };
export type GrpoSettings = SettingsOf<typeof GRPO_SETTINGS>;

/** The `grpo` loss bound to the loss parameters given (max_completion_length is GRPO's setting, passed on). */
export function grpoLoss(lossParams: Record<string, unknown>, s: GrpoSettings): BoundLoss {
  return resolveLoss('grpo', { ...lossParams, max_completion_length: s.max_completion_length });
}

/** Weights of the reward functions: reward_weights, or 1 each. */
export function rewardWeights(s: GrpoSettings, names: readonly string[]): number[] {
  if (s.reward_weights.trim() === '') return names.map(() => 1);
  const w = s.reward_weights.split(',').map((x) => Number(x.trim()));
  if (w.some((x) => !Number.isFinite(x))) throw new UserError(`grpo: reward_weights must be comma-separated numbers, got "${s.reward_weights}"`);
  if (w.length !== names.length) throw new UserError(`grpo: reward_weights has ${w.length} weights for ${names.length} reward functions (${names.join(', ')})`);
  return w;
}
