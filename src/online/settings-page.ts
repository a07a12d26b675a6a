/**
 * docs/settings.md as scripts/settings-doc.ts writes it: the settings tables of every command (the
 * online methods declare theirs beside their code, so they are imported here first, in the order
 * the page lists them) and the reward registry's `--reward` kinds.
 */
import './sampling.ts';
import './nash-md.ts';
import './sppo.ts';
import './grpo/settings.ts';
import './reward-model.ts';
import '../train/distill.ts';
import { settingsMarkdown } from '../train/settings.ts';
import { rewardMarkdown } from './rewards/index.ts';

export function settingsPage(): string {
  return `${settingsMarkdown()}\n${rewardMarkdown()}`;
}
