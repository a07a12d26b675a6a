/**
 * GRPO's entropy control on the online loop: the coefficient of the entropy bonus (entropy_coef) and,
 * under use_adaptive_entropy, the controller of Skywork-OR1 (arXiv 2505.22312; TRL's update, the pure
 * `nextEntropyCoef` of losses/grpo.ts). Every step's micro-batches get the coefficient and the last
 * step's entropy as the batch scalars `entropy_coef` and `last_world_entropy` (the loss applies the
 * coefficient only once that entropy fell to entropy_target); after the optimizer step the step's
 * pooled entropy moves the coefficient by entropy_coef_delta within [entropy_coef_min, entropy_coef_max].
 * Its state (coefficient, last entropy) is saved in every checkpoint as plain JSON numbers, so a
 * resumed run continues bit for bit.
 */
import { toOrt } from '../../runtime/session.ts';
import type { MicroBatch } from '../../train/run.ts';
import { nextEntropyCoef, type EntropyControl, type GrpoParams } from '../../../losses/grpo.ts';
import { ENTROPY_SUM, ENTROPY_TOKENS, type Columns } from './graph.ts';
import type { GrpoSettings } from './settings.ts';

interface State {
  coef: number;
  /** The last optimizer step's entropy; null before the first. */
  last: number | null;
}

export class EntropyController {
  private coef: number;
  private last: number | null = null;
  private readonly control: EntropyControl;

  constructor(p: GrpoParams, s: GrpoSettings, private readonly cols: Columns) {
    this.coef = p.entropy_coef;
    this.control = { entropy_target: p.entropy_target, entropy_coef_delta: s.entropy_coef_delta, entropy_coef_min: s.entropy_coef_min, entropy_coef_max: s.entropy_coef_max };
    // Checked before the first step rather than after it.
    if (p.use_adaptive_entropy) nextEntropyCoef(this.coef, 0, this.control);
  }

  /** The micro-batches of a step with the controller's scalars added (under use_adaptive_entropy). */
  feed(micro: MicroBatch[]): MicroBatch[] {
    if (!this.cols.adaptive) return micro;
    for (const m of micro) {
      m.feeds.entropy_coef = toOrt('float32', Float32Array.of(this.coef), []);
      // No measurement yet: NaN compares false with the target, so the coefficient is not applied.
      m.feeds.last_world_entropy = toOrt('float32', Float32Array.of(this.last ?? NaN), []);
    }
    return micro;
  }

  /** After an optimizer step: the controller moves on the step's entropy; `entropy_coef` for its metrics row. */
  stepped(graph: Readonly<Record<string, number>>): Record<string, number> {
    if (!this.cols.bonus) return {};
    if (this.cols.adaptive) {
      const tokens = graph[ENTROPY_TOKENS];
      const world = tokens > 0 ? graph[ENTROPY_SUM] / tokens : 0;
      this.coef = nextEntropyCoef(this.coef, world, this.control);
      this.last = world;
    }
    return { entropy_coef: this.coef };
  }

  state(): State {
    return { coef: this.coef, last: this.last };
  }

  restore(state: unknown): void {
    if (!state) return;
    const x = state as State;
    this.coef = x.coef;
    this.last = x.last;
  }
}
