import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { resolveConfig, DEFAULT_CONFIG } from '../src/train/config.ts';
import { LOW_MEMORY_PARAMS, runtimeOf } from '../src/train/run.ts';
import { countParameters, presetConfig } from '../src/models/config.ts';

describe('train config', () => {
  it('layers defaults, file and --param; unknown keys go to the loss', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-cfg-'));
    writeFileSync(join(dir, 'c.json'), JSON.stringify({ learning_rate: 0.001, batch_size: 8, beta: 0.2 }));
    const { config, lossParams } = resolveConfig({ configFile: join(dir, 'c.json'), params: ['max_steps=4', 'beta=0.3', 'lr_scheduler=cosine'] });
    expect(config.learning_rate).toBe(0.001);
    expect(config.batch_size).toBe(8);
    expect(config.max_steps).toBe(4);
    expect(config.lr_scheduler).toBe('cosine');
    expect(config.seed).toBe(DEFAULT_CONFIG.seed);
    expect(lossParams).toEqual({ beta: '0.3' });
  });
  it('rejects bad values naming the parameter', () => {
    expect(() => resolveConfig({ params: ['batch_size=0'] })).toThrow(/batch_size must be an integer in \[1/);
    expect(() => resolveConfig({ params: ['lr_scheduler=step'] })).toThrow(/lr_scheduler must be one of constant, linear, cosine/);
    expect(() => resolveConfig({ params: ['learning_rate'] })).toThrow(/key=value/);
    expect(() => resolveConfig({ params: ['max_prompt_length=600'] })).toThrow(/max_prompt_length/);
    expect(() => resolveConfig({ configFile: '/nonexistent.json' })).toThrow(/nonexistent\.json/);
  });
  it('sessions of a large model, or under recomputation, run without the memory pattern, the arena kept', () => {
    const plain = resolveConfig({ params: [] }).config;
    const rec = resolveConfig({ params: ['gradient_checkpointing=true'] }).config;
    const small = presetConfig('llama', 'small');
    const large = presetConfig('qwen2', 'qwen2.5-0.5b');
    expect(countParameters(small)).toBeLessThan(LOW_MEMORY_PARAMS);
    expect(countParameters(large)).toBeGreaterThanOrEqual(LOW_MEMORY_PARAMS);
    expect(runtimeOf(plain, small)).not.toHaveProperty('memPattern');
    expect(runtimeOf(plain)).not.toHaveProperty('memPattern');
    for (const r of [runtimeOf(plain, large), runtimeOf(rec, small), runtimeOf(rec)]) {
      // The arena stays on: without it every tensor past glibc's mmap threshold is fresh zero-filled pages (docs/performance.md).
      expect(r).toMatchObject({ memPattern: false });
      expect(r).not.toHaveProperty('arena');
    }
    expect(runtimeOf(resolveConfig({ params: ['threads=1'] }).config, large)).toMatchObject({ threads: 1, memPattern: false });
  });
});
