//! The error type of the scheduler crate.

use pagoda_core::RequestId;
use thiserror::Error;

/// Everything the block pool, the KV cache manager and the scheduler refuse.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SchedulerError {
    #[error("invalid scheduler configuration `{field}`: {message}")]
    InvalidConfig {
        field: &'static str,
        message: String,
    },
    #[error("request `{req_id}` already exists")]
    DuplicateRequest { req_id: RequestId },
    #[error("request `{req_id}` has an empty prompt")]
    EmptyPrompt { req_id: RequestId },
    #[error(
        "request `{req_id}`: prompt of {num_prompt_tokens} tokens plus one generated token exceeds the maximum model length {max_model_len}"
    )]
    PromptTooLong {
        req_id: RequestId,
        num_prompt_tokens: usize,
        max_model_len: usize,
    },
    #[error(
        "request `{req_id}`: prompt of {num_prompt_tokens} tokens plus one generated token needs {num_blocks_needed} KV blocks but the whole cache has {num_usable_blocks}"
    )]
    ExceedsKvCache {
        req_id: RequestId,
        num_prompt_tokens: usize,
        num_blocks_needed: usize,
        num_usable_blocks: usize,
    },
    #[error("no free blocks available")]
    NoFreeBlocks,
    #[error("asked for {requested} blocks but only {free} are free")]
    NotEnoughFreeBlocks { requested: usize, free: usize },
    #[error("block id {block_id} is out of range (pool of {num_blocks} blocks)")]
    InvalidBlockId { block_id: u32, num_blocks: usize },
    #[error("block {block_id} is the reserved null block")]
    NullBlock { block_id: u32 },
    #[error("block {block_id} is not in use (ref_cnt is 0)")]
    BlockNotInUse { block_id: u32 },
    #[error("block {block_id} is not in the free queue")]
    NotInFreeQueue { block_id: u32 },
    #[error("block {block_id} is already in the free queue")]
    AlreadyInFreeQueue { block_id: u32 },
    #[error("cannot reset the prefix cache while {num_used_blocks} blocks are in use")]
    PrefixCacheInUse { num_used_blocks: usize },
    #[error("{status:?} is not a finished status")]
    InvalidFinishStatus { status: pagoda_core::RequestStatus },
    #[error("{num_blocks} blocks but {num_hashes} hashes given to cache")]
    HashCountMismatch {
        num_blocks: usize,
        num_hashes: usize,
    },
}
