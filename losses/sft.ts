/**
 * SFT on the chosen responses: the per-token negative log-likelihood
 *
 *   L = −logp(w) / n(w)
 *
 * Only `policy_chosen_logps` and `chosen_tokens` are read (TRL averages over the batch's tokens;
 * here each pair's per-token NLL, then the batch mean, so every row has its own value).
 */
import { pairwiseLoss } from './core/pairwise.ts';
import type { Params } from './core/types.ts';

export const sft = pairwiseLoss<Params>({
  name: 'sft',
  paper: 'supervised fine-tuning (maximum likelihood of the chosen responses)',
  params: [],
  options: [],
  keys: () => ['policy_chosen_logps', 'chosen_tokens'],
  ref(h) {
    return {
      value: h.pw.map((x, i) => -x / h.nw[i]),
      dw: h.nw.map((n) => -1 / n),
      dl: new Float64Array(h.B),
    };
  },
  emit(t) {
    const g = t.g;
    return { perExample: g.neg(g.div(t.pw, t.nw)) };
  },
});
