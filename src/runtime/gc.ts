/**
 * A full garbage collection on request. Parameter-sized arrays (a 0.5B model's gradients, the
 * weights a loop loaded before its training state took them over) are freed only when V8 next
 * collects, which a small JavaScript heap does not ask for soon: until then they add to the peak.
 * V8's gc is reached without --expose-gc, through a flag set at run time and a fresh context.
 */
import v8 from 'node:v8';
import { runInNewContext } from 'node:vm';

let gc: (() => void) | null = null;

export function collectGarbage(): void {
  if (!gc) {
    v8.setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void;
  }
  gc();
}
