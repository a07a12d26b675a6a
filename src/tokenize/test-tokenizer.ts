/**
 * A small byte-level BPE tokenizer generated on the spot for `prefzoo init-model` (nothing can be
 * downloaded). Ids 0–255 are the 256 bytes (id = byte value, spelled with GPT-2's printable
 * byte-to-character table), so every UTF-8 text encodes and decodes back exactly; ids 256–260 are
 * special tokens; the rest are merges learned from a built-in English sample (or a given corpus).
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import { writeFileAtomic } from '../io/atomic.ts';

export const GENERATED_SPECIAL_TOKENS = ['<|bos|>', '<|eos|>', '<|pad|>', '<|im_start|>', '<|im_end|>'] as const;

/**
 * ChatML with a leading BOS: `<|im_start|>role\ncontent<|im_end|>\n` per message. With `tools`, a
 * system turn lists them (as JSON) first; an assistant's `tool_calls` follow its content as Hermes /
 * Qwen `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` blocks, so tiny test models can call
 * tools. Without tools or calls the render is plain ChatML.
 */
export const GENERATED_CHAT_TEMPLATE =
  '{{ bos_token }}' +
  "{%- if tools %}{{ '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{%- endif %}" +
  "{{ '# Tools\\n\\nTo call a function, write <tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>. The functions:\\n<tools>' }}" +
  "{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{%- endfor %}{{ '\\n</tools><|im_end|>\\n' }}{%- endif %}" +
  "{%- for message in messages %}{%- if not (tools and loop.first and message['role'] == 'system') %}" +
  "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}" +
  "{%- if message['role'] == 'assistant' and message['tool_calls'] %}{%- for call in message['tool_calls'] %}" +
  "{%- if message['content'] or not loop.first %}{{ '\\n' }}{%- endif %}" +
  "{%- set fn = call['function'] if call['function'] is defined else call %}" +
  "{{ '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}" +
  "{%- if fn['arguments'] is string %}{{ fn['arguments'] }}{%- else %}{{ fn['arguments'] | tojson }}{%- endif %}{{ '}\\n</tool_call>' }}" +
  '{%- endfor %}{%- endif %}' +
  "{{ '<|im_end|>\\n' }}{%- endif %}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";

/** The split GPT-2's byte-level pre-tokenizer applies before BPE (contractions, letters, digits, other, spaces). */
const PRETOKENIZE = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/**
 * GPT-2's byte → character table: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * are shifted to U+0100 onwards, so every token is a visible string.
 */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const table: string[] = [];
  let shifted = 0;
  for (let b = 0; b < 256; b++) table.push(String.fromCharCode(printable(b) ? b : 256 + shifted++));
  return table;
})();

/** A sample of plain English and chat phrasing the default merges are learned from. */
const DEFAULT_CORPUS = `
The assistant answers the question of the user in a short and helpful way.
A good answer is clear, correct and polite; a bad answer is wrong, rude or off topic.
The user asked how to make a cup of tea, and the assistant explained that you should boil the water first.
What is the capital of France? The capital of France is Paris.
Can you help me write a short poem about the sea? Sure, here is a poem about the sea and the sky.
Please explain why the sky is blue. Sunlight is scattered by the air, and blue light is scattered the most.
I think that this is a very good idea, but we should check the numbers again before we start.
There are many ways to solve this problem; the simplest one is to count the items one by one.
She said that they would come back tomorrow morning, after the meeting with the other team.
Thank you for your question! Here is what I would recommend for a beginner who wants to learn.
He was not sure whether the answer was right, so he asked his friend to read it again.
The weather today is warm and sunny, with a light wind from the west in the afternoon.
First, read the instructions. Then, follow each step in order. Finally, check your work.
You are a helpful assistant. The system message tells the model how it should behave.
Is it true that water boils at one hundred degrees? Yes, at sea level water boils at 100 degrees Celsius.
In 2024 there were 365 days in the first 12 months, and 1 more day because it was a leap year.
This response is better than that response because it is more accurate and easier to understand.
We want the model to prefer the chosen answer over the rejected answer for every prompt in the data.
Learning from human preferences makes language models more useful, honest and harmless.
If you have any other questions, feel free to ask, and I will do my best to answer them.
`;

export interface GenerateTokenizerOptions {
  /** Number of BPE merges to learn (default 200; fewer if the corpus runs out of repeated pairs). */
  merges?: number;
  /** Text to learn merges from (default: a built-in English sample). */
  corpus?: string;
  /** `model_max_length` written to tokenizer_config.json (default 2048). */
  modelMaxLength?: number;
  /** The chat template written to tokenizer_config.json (default {@link GENERATED_CHAT_TEMPLATE}). */
  chatTemplate?: string;
}

export interface GeneratedTokenizerInfo {
  /** Number of token ids (bytes + specials + merges). */
  vocabSize: number;
  bosId: number;
  eosId: number;
  padId: number;
  imStartId: number;
  imEndId: number;
  merges: Array<[string, string]>;
}

/**
 * Learns up to `count` merges: repeatedly joins the most frequent adjacent pair of symbols inside
 * pre-tokenized words (ties broken by the pair's spelling, so the result is deterministic).
 */
export function learnMerges(corpus: string, count: number): Array<[string, string]> {
  const encoder = new TextEncoder();
  const wordCounts = new Map<string, number>();
  for (const w of corpus.match(PRETOKENIZE) ?? []) wordCounts.set(w, (wordCounts.get(w) ?? 0) + 1);
  const words = [...wordCounts.entries()].map(([w, n]) => ({ symbols: Array.from(encoder.encode(w), (b) => BYTE_TO_CHAR[b]), n }));
  const merges: Array<[string, string]> = [];
  while (merges.length < count) {
    const pairs = new Map<string, number>();
    for (const { symbols, n } of words) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const key = symbols[i] + '\u0000' + symbols[i + 1];
        pairs.set(key, (pairs.get(key) ?? 0) + n);
      }
    }
    let best: string | null = null;
    let bestCount = 1;
    for (const [key, n] of pairs) {
      if (n > bestCount || (n === bestCount && best !== null && key < best)) {
        best = key;
        bestCount = n;
      }
    }
    // A pair seen once compresses nothing worth a vocabulary slot.
    if (best === null) break;
    const [a, b] = best.split('\u0000') as [string, string];
    merges.push([a, b]);
    for (const w of words) {
      const out: string[] = [];
      for (let i = 0; i < w.symbols.length; i++) {
        if (i + 1 < w.symbols.length && w.symbols[i] === a && w.symbols[i + 1] === b) {
          out.push(a + b);
          i++;
        } else out.push(w.symbols[i]);
      }
      w.symbols = out;
    }
  }
  return merges;
}

/**
 * Writes `tokenizer.json`, `tokenizer_config.json` (with {@link GENERATED_CHAT_TEMPLATE}) and
 * `generation_config.json` (stop on `<|eos|>` or `<|im_end|>`) into `dir`, each atomically.
 */
export function writeTokenizer(dir: string, opts: GenerateTokenizerOptions = {}): GeneratedTokenizerInfo {
  const count = opts.merges ?? 200;
  if (!Number.isInteger(count) || count < 0) throw new UserError(`merges must be a non-negative integer, got ${opts.merges}`);
  const merges = learnMerges(opts.corpus ?? DEFAULT_CORPUS, count);
  const vocab: Record<string, number> = {};
  BYTE_TO_CHAR.forEach((c, b) => (vocab[c] = b));
  const specialIds: Record<string, number> = {};
  GENERATED_SPECIAL_TOKENS.forEach((t, i) => {
    vocab[t] = 256 + i;
    specialIds[t] = 256 + i;
  });
  let next = 256 + GENERATED_SPECIAL_TOKENS.length;
  // Two merges can spell the same string ("ab"+"c", "a"+"bc"); the token keeps its first id.
  for (const [a, b] of merges) if (!Object.hasOwn(vocab, a + b)) vocab[a + b] = next++;
  const [bosId, eosId, padId, imStartId, imEndId] = GENERATED_SPECIAL_TOKENS.map((t) => specialIds[t]);

  const addedTokens = GENERATED_SPECIAL_TOKENS.map((content) => ({
    id: specialIds[content],
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    // Every sequence starts with BOS when special tokens are requested.
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|bos|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|bos|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|bos|>': { id: '<|bos|>', ids: [bosId], tokens: ['<|bos|>'] } },
    },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges,
    },
  };
  const tokenizerConfig = {
    add_bos_token: true,
    add_eos_token: false,
    added_tokens_decoder: Object.fromEntries(addedTokens.map(({ id, ...rest }) => [String(id), rest])),
    additional_special_tokens: ['<|im_start|>', '<|im_end|>'],
    bos_token: '<|bos|>',
    eos_token: '<|eos|>',
    pad_token: '<|pad|>',
    unk_token: null,
    chat_template: opts.chatTemplate ?? GENERATED_CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    model_max_length: opts.modelMaxLength ?? 2048,
    tokenizer_class: 'PreTrainedTokenizerFast',
  };
  const generationConfig = { bos_token_id: bosId, eos_token_id: [eosId, imEndId], pad_token_id: padId };
  fs.mkdirSync(dir, { recursive: true });
  const write = (name: string, obj: unknown) =>
    writeFileAtomic(path.join(dir, name), [Buffer.from(JSON.stringify(obj, null, 2) + '\n', 'utf8')]);
  write('tokenizer.json', tokenizerJson);
  write('tokenizer_config.json', tokenizerConfig);
  write('generation_config.json', generationConfig);
  return { vocabSize: next, bosId, eosId, padId, imStartId, imEndId, merges };
}
