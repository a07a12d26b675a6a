/**
 * The hand-off to TRL (docs/trl-handoff.md). There is no Python here, so the
 * files are read with readers written from the format specifications (helpers/independent-readers)
 * and checked against what the Python side requires:
 *  - `datasets.load_dataset("parquet", data_files=…)` (pyarrow): standard Parquet, one schema for
 *    every shard; TRL's DPOTrainer reads the columns `prompt`, `chosen`, `rejected`, each a string
 *    or, conversational, a list of {role, content} structs (the standard three-level LIST encoding,
 *    UTF8 strings), the prompt ending with a user turn and chosen/rejected holding assistant turns;
 *  - `AutoModelForCausalLM.from_pretrained(RUN/final)`: config.json with model_type and
 *    architectures, model.safetensors whose `__metadata__.format` is "pt" (transformers refuses
 *    other formats), tensors tiling the data exactly, and the checkpoint names and shapes of
 *    transformers' Llama for that config; tokenizer.json + tokenizer_config.json for AutoTokenizer.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { convert } from '../datasets/convert.ts';
import { readCanonical } from '../datasets/parquet.ts';
import { initModelFolder } from '../src/models/init.ts';
import { train } from '../src/train/trainer.ts';
import { readParquetFooter, readSafetensorsHeader, type ParquetSchemaNode } from './helpers/independent-readers.ts';

const shared = resolve(__dirname, '..', '..', 'shared', 'data');
const root = mkdtempSync(join(tmpdir(), 'pz-trl-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const BYTE_ARRAY = 6;
const UTF8 = 0;
const LIST = 3;
const LOGICAL_STRING = 1;
const LOGICAL_LIST = 3;
const REPEATED = 2;

function isString(n: ParquetSchemaNode): boolean {
  return n.type === BYTE_ARRAY && (n.convertedType === UTF8 || n.logicalType === LOGICAL_STRING) && n.children.length === 0;
}

/** <name> (LIST) → repeated group → element: struct {role: string, content: string}. */
function isMessageList(n: ParquetSchemaNode): boolean {
  if (!(n.convertedType === LIST || n.logicalType === LOGICAL_LIST) || n.children.length !== 1) return false;
  const rep = n.children[0];
  if (rep.repetition !== REPEATED || rep.children.length !== 1) return false;
  const el = rep.children[0];
  const names = el.children.map((c) => c.name).sort();
  return el.type === undefined && names.join(',') === 'content,role' && el.children.every(isString);
}

function column(f: ReturnType<typeof readParquetFooter>, name: string): ParquetSchemaNode {
  const c = f.schema.children.find((x) => x.name === name);
  if (!c) throw new Error(`no column ${name} in ${f.schema.children.map((x) => x.name).join(', ')}`);
  return c;
}

describe('converted Parquet loads with datasets in the columns DPOTrainer reads', () => {
  it('conversational (sharegpt → messages): prompt/chosen/rejected are lists of {role, content}', async () => {
    const dir = join(root, 'conv');
    mkdirSync(dir);
    const s = await convert([join(shared, 'dpo_en_demo.json')], join(dir, 'train.parquet'), { shardBytes: 64 * 1024 });
    expect(s.outputs.length).toBeGreaterThan(1);
    let rows = 0;
    let first: string | null = null;
    for (const file of s.outputs) {
      const f = readParquetFooter(file);
      rows += f.numRows;
      for (const name of ['prompt', 'chosen', 'rejected']) expect(isMessageList(column(f, name)), `${file}: ${name}`).toBe(true);
      // load_dataset casts every shard to one schema: they must agree.
      const shape = JSON.stringify(f.schema);
      first ??= shape;
      expect(shape).toBe(first);
      expect(JSON.parse(f.keyValue.get('prefzoo')!)).toMatchObject({ kind: 'pairwise', text: 'messages' });
      // A "huggingface" key would override the features datasets infers; none is written.
      expect(f.keyValue.has('huggingface')).toBe(false);
    }
    expect(rows).toBe(300);
    // DPOTrainer's conversational layout: the prompt ends with a user turn, the answers are assistant turns.
    const { table } = await readCanonical(join(dir, 'train.parquet'));
    for (let i = 0; i < table.numRows; i++) {
      const msgs = (c: string) => (table.getChild(c)!.get(i) as { toArray(): { role: string }[] }).toArray().map((m) => m.role);
      expect(msgs('prompt').at(-1)).toBe('user');
      expect(new Set([...msgs('chosen'), ...msgs('rejected')])).toEqual(new Set(['assistant']));
    }
  });

  it('standard (plain text): prompt/chosen/rejected are UTF8 strings', async () => {
    const dir = join(root, 'plain');
    mkdirSync(dir);
    const src = join(dir, 'in.jsonl');
    const { writeFileSync } = await import('node:fs');
    writeFileSync(src, [{ prompt: 'Sky?', chosen: ' Blue.', rejected: ' Green.' }, { prompt: 'Grass?', chosen: ' Green.', rejected: ' Blue.' }].map((r) => JSON.stringify(r)).join('\n'));
    const s = await convert([src], join(dir, 'train.parquet'));
    const f = readParquetFooter(s.outputs[0]);
    expect(f.numRows).toBe(2);
    for (const name of ['prompt', 'chosen', 'rejected']) expect(isString(column(f, name)), name).toBe(true);
  });
});

describe('the trained model loads with transformers', () => {
  let final: string;
  beforeAll(async () => {
    const model = join(root, 'model');
    initModelFolder(model, 'llama', 'tiny', 4);
    const data = join(root, 'pairs.jsonl');
    const { writeFileSync } = await import('node:fs');
    writeFileSync(data, Array.from({ length: 4 }, (_, i) => JSON.stringify({ prompt: `Q${i}:`, chosen: ` yes ${i}`, rejected: ` no ${i}` })).join('\n'));
    final = (await train({ model, data, loss: 'dpo', out: join(root, 'run'), params: ['max_steps=1', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16'] })).finalDir;
  });

  it('RUN/final has config.json, model.safetensors in "pt" format with Llama names and shapes, and the tokenizer files', () => {
    const cfg = JSON.parse(readFileSync(join(final, 'config.json'), 'utf8'));
    expect(cfg.model_type).toBe('llama');
    expect(cfg.architectures).toEqual(['LlamaForCausalLM']);
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) expect(existsSync(join(final, f)), f).toBe(true);
    const h = readSafetensorsHeader(join(final, 'model.safetensors'));
    expect(h.metadata).toEqual({ format: 'pt' });
    // Tensors tile the data: sorted by offset, each starts where the previous ended.
    const spans = [...h.tensors.values()].sort((a, b) => a.begin - b.begin);
    let at = 0;
    for (const s of spans) {
      expect(s.begin).toBe(at);
      expect(s.end - s.begin).toBe(s.shape.reduce((a, b) => a * b, 1) * (s.dtype === 'F32' ? 4 : 2));
      at = s.end;
    }
    expect(at).toBe(h.dataBytes);
    // transformers' LlamaForCausalLM state dict for this config (lm_head tied when tie_word_embeddings).
    const D = cfg.hidden_size;
    const hd = cfg.head_dim ?? D / cfg.num_attention_heads;
    const kv = cfg.num_key_value_heads * hd;
    const I = cfg.intermediate_size;
    const want = new Map<string, number[]>([['model.embed_tokens.weight', [cfg.vocab_size, D]], ['model.norm.weight', [D]]]);
    if (!cfg.tie_word_embeddings) want.set('lm_head.weight', [cfg.vocab_size, D]);
    for (let l = 0; l < cfg.num_hidden_layers; l++) {
      const p = `model.layers.${l}.`;
      want.set(p + 'input_layernorm.weight', [D]).set(p + 'post_attention_layernorm.weight', [D]);
      want.set(p + 'self_attn.q_proj.weight', [cfg.num_attention_heads * hd, D]).set(p + 'self_attn.k_proj.weight', [kv, D]);
      want.set(p + 'self_attn.v_proj.weight', [kv, D]).set(p + 'self_attn.o_proj.weight', [D, cfg.num_attention_heads * hd]);
      want.set(p + 'mlp.gate_proj.weight', [I, D]).set(p + 'mlp.up_proj.weight', [I, D]).set(p + 'mlp.down_proj.weight', [D, I]);
    }
    expect(new Map([...h.tensors].map(([k, v]) => [k, v.shape]))).toEqual(want);
    expect(new Set([...h.tensors.values()].map((t) => t.dtype))).toEqual(new Set([cfg.torch_dtype === 'bfloat16' ? 'BF16' : 'F32']));
  });
});
