/** Tokenizers and chat templates of model folders; see each module for details. */
export { loadTokenizer, type LoadedTokenizer, type Message, type EncodeOptions, type DecodeOptions, type ChatTemplateOptions } from './tokenizer.ts';
export { tokenizePromptResponse, type PromptResponseIds } from './prompt-response.ts';
export {
  writeTokenizer,
  learnMerges,
  BYTE_TO_CHAR,
  GENERATED_CHAT_TEMPLATE,
  GENERATED_SPECIAL_TOKENS,
  type GenerateTokenizerOptions,
  type GeneratedTokenizerInfo,
} from './test-tokenizer.ts';
export {
  bridgeIds,
  bridgeText,
  chatPromptIds,
  checkTemplateExtends,
  endOfTurnStrings,
  renderChat,
  templateMessages,
  tokenizeConversation,
  TemplatePrefixError,
  type ChatRenderOptions,
  type ConversationIds,
  type SegmentKind,
} from './conversation.ts';
export {
  parseToolCalls,
  parseHermes,
  parseLlama3,
  templateToolSupport,
  toolCallFormatOf,
  TOOL_CALL_FORMATS,
  type ParsedTurn,
  type ToolCallError,
  type ToolCallErrorKind,
  type ToolCallFormat,
} from './tool-calls.ts';
