/**
 * GRPO's settings: its own table (the sampling settings, declared once in ../sampling.ts, and GRPO's
 * others), the trainer settings it honours and its defaults of them. Parsing, validation,
 * `prefzoo grpo --help` and docs/settings.md all come from this declaration.
 */
import { UserError } from '../../errors.ts';
import { resolveLoss, type BoundLoss } from '../../../losses/index.ts';
import { declareCommand, defineSettings, ONLINE_LOOP_SETTINGS, ROLLOUT, type SettingsOf } from '../../train/settings.ts';
import { SAMPLING_SETTINGS } from '../sampling.ts';
import { AGENT_HARNESS_SETTINGS, AGENT_SETTINGS } from './agent-settings.ts';
import { TEACHER_SETTINGS } from '../../train/teacher-model.ts';

const GROUP = 'GRPO';

export const GRPO_SETTINGS = defineSettings({
  ...SAMPLING_SETTINGS,
  num_iterations: { type: 'int', default: 1, min: 1, max: 1024, group: GROUP, trl: 'num_iterations', doc: 'μ: optimizer updates on each sampled round, the sampling policy’s log-probs kept as the old ones' },
  scale_rewards: { type: 'enum', choices: ['group', 'batch', 'none'], default: 'group', group: GROUP, trl: 'scale_rewards', paper: 'Dr. GRPO (2025) for none', doc: 'divide advantages by the reward std of the group, of the batch, or not at all' },
  advantage: { type: 'enum', choices: ['group', 'rloo'], default: 'group', group: GROUP, paper: 'RLOO: Ahmadian et al. (2024)', doc: "baseline: the group's mean reward (GRPO) or the mean of the group's other completions (RLOO)" },
  reward_weights: { type: 'string', default: '', group: GROUP, trl: 'reward_weights', doc: "comma-separated weight per reward function, in --reward order ('': 1 each)" },
  mask_truncated_completions: { type: 'boolean', default: false, group: GROUP, trl: 'mask_truncated_completions', paper: 'DAPO (2025)', doc: 'completions cut at max_completion_length (no end token) count in no loss term' },
  reward_timeout: { type: 'number', default: 300, min: 0, minOpen: true, max: 1e9, group: GROUP, doc: 'seconds a reward function may take on one round before the run stops' },
  log_completions: { type: 'int', default: 8, min: 0, max: 1 << 16, group: GROUP, trl: 'num_completions_to_print', doc: "completions of each logged round's first prompt written to completions.jsonl (0: none)" },
  // The adaptive-entropy controller (Skywork-OR1; TRL's names) moves entropy_coef after each optimizer
  // step (losses/grpo.ts `nextEntropyCoef`); its switch use_adaptive_entropy, entropy_target and the
  // starting entropy_coef are parameters of the `grpo` loss, which applies the gate.
  entropy_coef_delta: { type: 'number', default: 0.005, min: 0, max: 1e6, group: GROUP, trl: 'entropy_coef_delta', paper: 'Skywork-OR1 (2025)', doc: 'use_adaptive_entropy: the step by which entropy_coef moves after every optimizer step' },
  entropy_coef_min: { type: 'number', default: 0, min: -1e6, max: 1e6, group: GROUP, trl: 'entropy_coef_min', paper: 'Skywork-OR1 (2025)', doc: 'use_adaptive_entropy: the lowest entropy_coef' },
  entropy_coef_max: { type: 'number', default: 1, min: -1e6, max: 1e6, group: GROUP, trl: 'entropy_coef_max', paper: 'Skywork-OR1 (2025)', doc: 'use_adaptive_entropy: the highest entropy_coef' },
  ...AGENT_SETTINGS,
  ...AGENT_HARNESS_SETTINGS,
  ...TEACHER_SETTINGS,
});

export type GrpoSettings = SettingsOf<typeof GRPO_SETTINGS>;

/** The trainer settings GRPO honours: the online loop's, and evaluation and recomputation. */
export const GRPO_HONOURS = [...ONLINE_LOOP_SETTINGS, ...ROLLOUT, 'eval_data', 'eval_steps', 'eval_samples', 'gradient_checkpointing'] as const;

/**
 * GRPO's defaults of trainer settings, TRL GRPOConfig's: learning rate 1e-6, and 8 completions (one
 * group of the default num_generations) per micro-batch.
 */
declareCommand('grpo', { honours: GRPO_HONOURS, own: GRPO_SETTINGS, lossParams: 'grpo', defaults: { batch_size: 8, learning_rate: 1e-6 } });

/** The `grpo` loss bound to the loss parameters given (max_completion_length is GRPO's setting, passed on). */
export function grpoLoss(lossParams: Record<string, unknown>, s: GrpoSettings, rolloutDtype = 'f32'): BoundLoss {
  // Log-probs, entropies and the importance ratio use logits / temperature: greedy decoding has none.
  if (!(s.temperature > 0)) throw new UserError(`grpo: temperature must be > 0 (its log-probs use the logits divided by it), got ${s.temperature}`);
  const given: Record<string, unknown> = { ...lossParams, max_completion_length: s.max_completion_length };
  // The rollout feeds sampler log-probs, and vespo takes their correction per token (into its weight φ):
  // its mode defaults to token_truncate instead of TRL's sequence_mask.
  const modeGiven = 'vllm_importance_sampling_mode' in given || 'sampling_importance_sampling_mode' in given;
  if (given.loss_type === 'vespo' && !modeGiven) given.vllm_importance_sampling_mode = VESPO_SAMPLING_MODE;
  // Quantized rollouts sample from other weights than the trainer scores: the off-policy mask comes on
  // beside the correction (TRL's use_vllm=True), unless it is given.
  if (rolloutDtype !== 'f32' && !('off_policy_mask_threshold' in given)) given.off_policy_mask_threshold = QUANT_OFF_POLICY_MASK;
  return resolveLoss('grpo', given);
}

/** off_policy_mask_threshold's default under rollout_dtype q8/q4 (see `grpoLoss`). */
export const QUANT_OFF_POLICY_MASK = 0.5;

/** vllm_importance_sampling_mode's default under loss_type=vespo (see `grpoLoss`). */
export const VESPO_SAMPLING_MODE = 'token_truncate';

/** Weights of the reward functions: reward_weights, or 1 each. */
export function rewardWeights(s: GrpoSettings, names: readonly string[]): number[] {
  if (s.reward_weights.trim() === '') return names.map(() => 1);
  const w = s.reward_weights.split(',').map((x) => Number(x.trim()));
  if (w.some((x) => !Number.isFinite(x))) throw new UserError(`grpo: reward_weights must be comma-separated numbers, got "${s.reward_weights}"`);
  if (w.length !== names.length) throw new UserError(`grpo: reward_weights has ${w.length} weights for ${names.length} reward functions (${names.join(', ')})`);
  return w;
}
