/**
 * apache-arrow, as every module of prefzoo imports it (`import * as arrow from '…/datasets/arrow.ts'`).
 *
 * The package's ES-module entry is ~150 files: importing it costs ~0.3 s of CPU, paid by every CLI
 * run that touches data. Its one-file build (`Arrow.esnext.min.js`, the same release and API in a
 * single file, Node's stream helpers aside, which prefzoo does not use) loads in a fraction of that.
 * All of prefzoo shares this one copy, so `instanceof` holds between the tables it makes and reads;
 * a caller holding objects of its own `apache-arrow` import passes them through `tableFromIPC`.
 */
import { createRequire } from 'node:module';
import type * as A from 'apache-arrow';

const arrow = createRequire(import.meta.url)('apache-arrow/Arrow.esnext.min') as typeof A;

export const { Bool, Data, DataType, Field, Float16, Float64, Int32, List, RecordBatch, RecordBatchReader, Schema, Struct, Table, Utf8, Vector, util } = arrow;
export const { makeData, makeVector, tableFromArrays, tableFromIPC, tableToIPC, vectorFromArray } = arrow;

// The classes' types under the same names (a value export hides the package's type of that name).
export type Bool = A.Bool;
export type Data<T extends A.DataType = A.DataType> = A.Data<T>;
export type DataType<T extends A.Type = A.Type, C extends A.TypeMap = any> = A.DataType<T, C>;
export type Field<T extends A.DataType = any> = A.Field<T>;
export type Float16 = A.Float16;
export type Float64 = A.Float64;
export type Int32 = A.Int32;
export type List<T extends A.DataType = any> = A.List<T>;
export type RecordBatch<T extends A.TypeMap = any> = A.RecordBatch<T>;
export type RecordBatchReader<T extends A.TypeMap = any> = A.RecordBatchReader<T>;
export type Schema<T extends A.TypeMap = any> = A.Schema<T>;
export type Struct<T extends A.TypeMap = any> = A.Struct<T>;
export type Table<T extends A.TypeMap = any> = A.Table<T>;
export type Utf8 = A.Utf8;
export type Vector<T extends A.DataType = any> = A.Vector<T>;
export type { TypeMap } from 'apache-arrow';
