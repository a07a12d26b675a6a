import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeReport, lineChart } from '../src/train/report.ts';
import { UserError } from '../src/errors.ts';

describe('report', () => {
  it('draws one path per series through every point, and embeds eval and config', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-report-'));
    const rows = [1, 2, 3, 4].map((step) => ({ step, loss: 1 / step, 'rewards/accuracies': step / 4, 'rewards/margins': step }));
    writeFileSync(join(dir, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    writeFileSync(join(dir, 'eval.json'), JSON.stringify({ accuracy: 0.875 }));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ loss: 'dpo<x>' }));
    const html = readFileSync(writeReport(dir), 'utf8');
    expect(html.match(/<svg/g)!.length).toBe(3);
    // The loss path has four points: one move and three lines.
    const d = /<path d="([^"]+)"/.exec(html)![1];
    expect(d.match(/[ML]/g)!.length).toBe(4);
    expect(html).toContain('0.875');
    expect(html).toContain('dpo&lt;x&gt;');
    expect(html).not.toMatch(/<script|https?:\/\/(?!www\.w3\.org)/);
  });
  it('names the missing metrics file', () => {
    expect(() => writeReport('/nonexistent-run')).toThrow(UserError);
    expect(existsSync('/nonexistent-run/report.html')).toBe(false);
  });
  it('maps the extremes of a series to the plot edges', () => {
    const svg = lineChart('t', [{ label: 'a', points: [[0, 0], [10, 5]] }]);
    expect(svg).toContain('M56.0,188.0L408.0,24.0');
  });
});
