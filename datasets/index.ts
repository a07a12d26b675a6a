/**
 * The datasets layer's public surface: canonical schemas, conversion, Parquet I/O and inspection.
 * `tokenize` and the trainer read canonical files with readCanonical and write them with writeCanonical.
 */
export { type Kind, type Message, type PrefzooMeta, type Text, type TextMode, KIND_SPECS, META_KEY, canonicalSchema, columnType, makeMeta, parseMeta, schemaProblems } from './schema.ts';
export { BatchBuilder, columnBuilder } from './columns.ts';
export { type Canonical, type WriteOptions, ParquetSink, datasetFiles, readCanonical, readParquetBatches, writeCanonical } from './parquet.ts';
export { type ConvertOptions, type ConvertSummary, convert } from './convert.ts';
export { type FormatName, FORMAT_NAMES, detectFormat } from './formats/index.ts';
export { type InspectReport, formatReport, inspectFile } from './inspect.ts';
