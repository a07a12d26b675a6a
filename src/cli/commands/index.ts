import type { Command } from 'commander';
import { register as convert } from './convert.ts';
import { register as gradcheck } from './gradcheck.ts';
import { register as inspect } from './inspect.ts';
import { register as initModel } from './init-model.ts';
import { register as logps } from './logps.ts';
import { register as report } from './report.ts';
import { register as trainCmd } from './train.ts';
import { register as evalCmd } from './eval.ts';
import { register as demo } from './demo.ts';
import { register as tokenize } from './tokenize.ts';
import { register as loss } from './loss.ts';
import { register as bench } from './bench.ts';
import { register as generate } from './generate.ts';
import { register as sppo } from './sppo.ts';
import { register as nashMd } from './nash-md.ts';
import { register as rewardTrain } from './reward-train.ts';
import { register as doctor } from './doctor.ts';
import { register as artifacts } from './artifacts.ts';
import { register as exportCmd } from './export.ts';

/** Every `prefzoo` subcommand: one module each, one line here each. */
export const commands: Array<(program: Command) => void> = [
  convert,
  gradcheck,
  inspect,
  initModel,
  logps,
  report,
  trainCmd,
  evalCmd,
  demo,
  tokenize,
  loss,
  bench,
  generate,
  sppo,
  nashMd,
  rewardTrain,
  doctor,
  artifacts,
  exportCmd,
];
