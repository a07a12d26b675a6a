/**
 * Models and datasets by their Hugging Face Hub names (docs/hub.md): the shared cache, and downloads
 * through `@huggingface/hub` into it. Stands on errors.ts and progress.ts only, so any layer above
 * may resolve a name.
 */
export { hubCacheDir, repoFolderName, CachedRepo, type RepoType } from './cache.ts';
export { offlineFromEnv, tokenFromEnv, DEFAULT_ENDPOINT, type HubContext } from './client.ts';
export { resolveModel, resolveDataset, isHubName, parseName, splitFiles, hubContext, PARQUET_REVISION, type HubOptions, type HubSnapshot, type ModelWant, type ResolvedData } from './resolve.ts';
