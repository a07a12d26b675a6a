// The reference the convert benchmark compares against: read a JSONL file and JSON.parse every line.
import { createReadStream } from 'node:fs';
import { StringDecoder } from 'node:string_decoder';

const decoder = new StringDecoder('utf8');
let carry = '';
let records = 0;
let keys = 0;
for await (const chunk of createReadStream(process.argv[2], { highWaterMark: 1 << 20 })) {
  const text = carry + decoder.write(chunk);
  let start = 0;
  for (let nl = text.indexOf('\n'); nl !== -1; nl = text.indexOf('\n', start)) {
    const rec = JSON.parse(text.slice(start, nl));
    keys += Object.keys(rec).length; // keep the parse result alive so it cannot be optimised away
    records++;
    start = nl + 1;
  }
  carry = text.slice(start);
}
if (carry.trim()) records++;
process.stdout.write(`${records} ${keys}\n`);
