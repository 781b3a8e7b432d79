//! The route handlers. Each parses its body itself (so malformed JSON and
//! oversized bodies get OpenAI error objects), validates, submits to the engine
//! and answers by streaming or collecting.

use super::error::ApiError;
use super::format::{Api, ChoiceState, Ctx};
use super::protocol::{
    chat_mode, check_prompt_len, params_for_sample, parse_body, parse_generation, sampling_params,
    truncate_ids, ChatRequest, CommonFields, CompletionRequest, DetokenizeRequest, PromptField,
    TokenizeRequest, ALL_LOGPROBS,
};
use super::state::{unix_now, AppState, TRIM_AFTER_BODY_BYTES};
use super::stream::{collect, sse_response, Sample};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_core::SamplingParams;
use pagoda_engine::structured::Grammar;
use pagoda_engine::{EngineError, PromptInput, SubmitRequest};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Group ids for the sequences of one API request (the scheduler's seat share).
static NEXT_GROUP: AtomicU64 = AtomicU64::new(1);

pub(super) type Body = Result<Bytes, BytesRejection>;

/// A tokenized prompt, with its text when `echo` shows it.
pub(super) type Prompt = (Vec<u32>, Option<String>);

/// Unique ids: a per-process random-ish prefix plus a counter.
fn next_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:x}{n:06x}", start & 0xffff_ffff)
}

impl AppState {
    /// A request may name the served model or leave `model` out; anything else is 404.
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None | Some("") => Ok(()),
            Some(m) if m == self.model_name || self.model_aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::NotFound {
                message: format!("The model `{m}` does not exist."),
            }),
        }
    }

    /// `--max-logprobs`, with vLLM's message (`-1` asks for the whole vocabulary).
    fn check_logprobs(&self, param: &str, k: Option<usize>) -> Result<Option<usize>, ApiError> {
        let vocab = self.engine.model_info().vocab_size;
        let k = k.map(|k| if k == ALL_LOGPROBS { vocab } else { k });
        match k {
            Some(k) if k > self.max_logprobs => Err(ApiError::bad(
                param,
                format!(
                    "Requested sample logprobs of {k}, which is greater than max allowed: {}",
                    self.max_logprobs
                ),
            )),
            k => Ok(k),
        }
    }

    /// `prompt_logprobs` under `--max-logprobs`, with vLLM's rule and message: `-1`
    /// asks for the whole vocabulary and is checked as that many (so it passes
    /// only when `--max-logprobs` covers the vocabulary).
    fn check_prompt_logprobs(&self, k: Option<usize>) -> Result<(), ApiError> {
        let vocab = self.engine.model_info().vocab_size;
        let k = k.map(|k| {
            if k == pagoda_core::ALL_PROMPT_LOGPROBS {
                vocab
            } else {
                k
            }
        });
        match k {
            Some(k) if k > self.max_logprobs => Err(ApiError::bad(
                "prompt_logprobs",
                format!(
                    "Requested prompt logprobs of {k}, which is greater than max allowed: {}",
                    self.max_logprobs
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn read_body(&self, body: Body) -> Result<Bytes, ApiError> {
        body.map_err(|r| ApiError::from_body_rejection(r, self.max_body_bytes))
    }

    fn ctx(&self, api: Api, c: &CommonFields, logprobs: bool) -> Ctx {
        let tok = self.engine.tokenizer().clone();
        Ctx {
            api,
            id: next_id(if api == Api::Chat { "chatcmpl" } else { "cmpl" }),
            created: unix_now(),
            model: self.model_name.clone(),
            // `logprob_token_ids` alone asks for logprobs too (of those tokens).
            logprobs: logprobs || c.logprob_token_ids.is_some(),
            tokens_as_ids: c.return_tokens_as_token_ids.unwrap_or(false)
                || self.return_tokens_as_token_ids,
            // `--enable-force-include-usage` acts as `include_usage: true` (vLLM).
            include_usage: c.include_usage() || self.force_include_usage,
            continuous_usage: c.continuous_usage()
                || (self.force_include_usage
                    && c.stream_options
                        .as_ref()
                        .and_then(|o| o.continuous_usage_stats)
                        .unwrap_or(false)),
            return_token_ids: c.return_token_ids.unwrap_or(false),
            prompt_logprobs: c.prompt_logprobs.is_some(),
            text: Arc::new(move |id: u32| tok.decode(&[id], false).unwrap_or_default()),
            metrics: self.metrics.clone(),
            shaping: None,
        }
    }

    /// Refuses text that could not fit in the context even at the longest token
    /// (see [`AppState::max_prompt_bytes`]) before spending time tokenizing it.
    pub(super) fn check_text_len(&self, param: &str, bytes: usize) -> Result<(), ApiError> {
        let limit = self.max_prompt_bytes;
        if bytes > limit {
            let max_len = self.engine.model_info().max_model_len;
            return Err(ApiError::bad(
                param,
                format!(
                    "the text is {bytes} bytes long; this model's maximum context length is {max_len} tokens, \
                     which no text over {limit} bytes fits in"
                ),
            ));
        }
        Ok(())
    }

    /// [`AppState::encode`] for a prompt that will be truncated to `k` tokens: text
    /// far beyond what `k` tokens can hold is cut first (at the kept end, with the
    /// same slack as the length bound), so truncation never tokenizes megabytes.
    fn encode_truncated(
        &self,
        text: &str,
        add_special_tokens: bool,
        trunc: Option<(usize, bool)>,
    ) -> Result<Vec<u32>, ApiError> {
        let Some((k, left)) = trunc else {
            return self.encode(text, add_special_tokens);
        };
        let max_len = self.engine.model_info().max_model_len.max(1);
        let keep = (self.max_prompt_bytes / max_len).saturating_mul(k).max(1);
        let cut = if text.len() <= keep {
            text
        } else if left {
            let mut i = text.len() - keep;
            while !text.is_char_boundary(i) {
                i += 1;
            }
            &text[i..]
        } else {
            let mut i = keep;
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            &text[..i]
        };
        self.encode(cut, add_special_tokens)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        self.check_text_len("prompt", text.len())?;
        self.engine
            .tokenizer()
            .encode(text, add_special_tokens)
            .map_err(|e| ApiError::bad("prompt", format!("cannot tokenize the prompt: {e}")))
    }

    /// vLLM's `bad_words` as token sequences: each word as tokenized at the start of
    /// a text and, when that differs in its first token only, after a space.
    fn bad_words_ids(&self, words: &[String]) -> Result<Vec<Vec<u32>>, ApiError> {
        let mut out: Vec<Vec<u32>> = Vec::new();
        for w in words {
            let w = w.trim_start();
            let encode = |t: &str| {
                self.engine
                    .tokenizer()
                    .encode(t, false)
                    .map_err(|e| ApiError::bad("bad_words", format!("cannot tokenize `{w}`: {e}")))
            };
            let bare = encode(w)?;
            if bare.is_empty() {
                return Err(ApiError::bad(
                    "bad_words",
                    format!("bad word `{w}` has no tokens"),
                ));
            }
            let spaced = encode(&format!(" {w}"))?;
            let differs = spaced.first() != bare.first() && spaced.len() == bare.len();
            out.push(bare);
            if differs {
                out.push(spaced);
            }
        }
        Ok(out)
    }

    /// A reasoning format's markers as this model's token ids.
    fn reasoning_gate(
        &self,
        m: super::reasoning::Markers,
    ) -> Result<pagoda_engine::structured::ReasoningGate, ApiError> {
        let tok = self.engine.tokenizer();
        let ids = |s: &str| {
            tok.encode(s, false).map_err(|e| ApiError::Internal {
                message: format!("tokenizing the reasoning marker {s:?}: {e}"),
            })
        };
        Ok(pagoda_engine::structured::ReasoningGate {
            start: ids(m.start)?,
            end: ids(m.end)?,
            starts_in_reasoning: m.starts_in_reasoning,
        })
    }

    fn check_ids(&self, param: &str, ids: &[u32]) -> Result<(), ApiError> {
        super::protocol::check_in_vocab(param, ids, self.engine.model_info().vocab_size)
    }

    /// Submits `n` samples per prompt (seeds offset per sample) and answers.
    pub(super) async fn run(&self, prep: Prepared, arrival: Instant) -> Result<Response, ApiError> {
        let (ctx, samples, stream) = self.submit(prep, arrival).await?;
        if stream {
            Ok(sse_response(Arc::new(ctx), samples))
        } else {
            let states = collect(&ctx, samples).await?;
            let body =
                serde_json::to_vec(&ctx.response(&states)).map_err(|e| ApiError::Internal {
                    message: format!("cannot serialize the response: {e}"),
                })?;
            if body.len() >= TRIM_AFTER_BODY_BYTES {
                // A large answer (prompt logprobs, many samples) leaves freed heap
                // pages behind: returned to the OS once the server is idle.
                self.needs_trim
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
        }
    }

    /// Checks a prepared request against the limits and submits its samples;
    /// returns them with whether the client asked for a stream.
    pub(super) async fn submit(
        &self,
        prep: Prepared,
        arrival: Instant,
    ) -> Result<(Ctx, Vec<Sample>, bool), ApiError> {
        let Prepared {
            ctx,
            prompts,
            params,
            n,
            common: c,
            priority,
            grammar,
        } = prep;
        let c = &c;
        let grammar = match grammar {
            Some(g) => Some(g.wait().await?),
            None => None,
        };
        // With a reasoning parser the constraint applies to the answer only.
        let gate = match (&grammar, ctx.shaping.as_ref().and_then(|s| s.reasoning)) {
            (Some(_), Some(parser)) => Some(self.reasoning_gate(parser.markers())?),
            _ => None,
        };
        let max_len = self.engine.model_info().max_model_len;
        let mut prompts = prompts;
        if let Some((k, left)) = c.truncation(max_len)? {
            for (ids, _) in &mut prompts {
                truncate_ids(ids, k, left);
            }
        }
        for (ids, _) in &prompts {
            check_prompt_len(ids.len(), params.max_tokens, max_len)?;
        }
        self.stop_limits.check(&params.stop)?;
        let num_seqs = prompts.len().saturating_mul(n);
        if num_seqs > self.max_seqs_per_request {
            return Err(ApiError::bad(
                "n",
                format!(
                    "this request asks for {num_seqs} sequences ({} prompts x n = {n}); the limit is {} \
                     (--max-seqs-per-request)",
                    prompts.len(),
                    self.max_seqs_per_request
                ),
            ));
        }
        let mut samples = Vec::with_capacity(prompts.len() * n);
        // The sequences of one API request share a group: the scheduler's seat
        // share keeps them from holding every seat while others wait.
        let group = (num_seqs > 1).then(|| NEXT_GROUP.fetch_add(1, Ordering::Relaxed));
        for (p, (ids, _)) in prompts.iter().enumerate() {
            if self.log_requests {
                // Not under the HTTP layer's target: `--uvicorn-log-level` leaves it be.
                tracing::info!(
                    target: "pagoda::requests",
                    "Received request {}-{p}: prompt tokens: {}, n: {n}, params: {params:?}",
                    ctx.id,
                    ids.len()
                );
            }
        }
        for (p, (ids, echo)) in prompts.into_iter().enumerate() {
            // vLLM observes `n` once per prompt (its parent request).
            self.metrics.observe_n(n);
            let echo = echo.map(|t| (t, ids.clone()));
            let grammar = match (&grammar, &gate) {
                (Some(g), Some(gate)) => Some(g.clone().after_reasoning(gate, &ids)),
                (g, _) => g.clone(),
            };
            for i in 0..n {
                let index = p * n + i;
                // On failure the samples already submitted drop here, which aborts them.
                let stream = self.engine.submit(SubmitRequest {
                    request_id: format!("{}-{index}", ctx.id),
                    prompt: PromptInput::Tokens(ids.clone()),
                    params: params_for_sample(&params, i),
                    cache_salt: c.cache_salt.clone(),
                    priority,
                    group,
                    grammar: grammar.clone(),
                })?;
                let mut state = ChoiceState::new(index, i == 0, ids.len(), arrival)
                    .with_prompt_ids(ctx.return_token_ids.then(|| ids.clone()));
                state.shaper = ctx.shaping.as_ref().map(|s| s.start());
                samples.push(Sample {
                    state,
                    stream,
                    echo: echo.clone(),
                });
            }
        }
        Ok((ctx, samples, c.stream()))
    }
}

/// Reads the body, then runs `f` on it on the blocking pool ([`AppState::offload`]).
pub(super) async fn on_pool<T: Send + 'static>(
    st: &Arc<AppState>,
    body: Body,
    f: fn(&AppState, &[u8]) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let bytes = st.read_body(body)?;
    let st2 = st.clone();
    st.offload(move || f(&st2, &bytes)).await
}

pub(super) fn respond(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

/// A parsed, tokenized and checked generation request, ready to submit.
pub(super) struct Prepared {
    ctx: Ctx,
    pub(super) prompts: Vec<Prompt>,
    params: SamplingParams,
    n: usize,
    common: CommonFields,
    priority: i32,
    /// The structured-output constraint, compiling (cloned for each sample once
    /// compiled).
    grammar: Option<PendingGrammar>,
}

/// Queues the request's structured-output constraint, if any, on the engine's
/// compile pool (dedicated threads with a large stack, a deadline and
/// cancellation: `pagoda_engine::structured::compile`), so that no compile holds
/// this preparation slot; [`AppState::run`] waits for it. An invalid schema, regex
/// or grammar is then a 400 with llguidance's message, naming `response_format`
/// when that is where the constraint came from.
fn compile_grammar(
    st: &AppState,
    params: &SamplingParams,
    common: &CommonFields,
) -> Result<Option<PendingGrammar>, ApiError> {
    let Some(spec) = &params.structured_outputs else {
        return Ok(None);
    };
    let from_response_format = common
        .response_format
        .as_ref()
        .and_then(|rf| rf.get("type"))
        .is_some_and(|t| t != "text");
    let ticket = st.engine.structured_compiler().submit(spec)?;
    Ok(Some(PendingGrammar {
        ticket,
        from_response_format,
    }))
}

/// A constraint being compiled (dropping it cancels the compile).
pub(super) struct PendingGrammar {
    ticket: pagoda_engine::structured::CompileTicket,
    from_response_format: bool,
}

impl PendingGrammar {
    /// The compiled grammar, or the 400 that explains why there is none.
    async fn wait(self) -> Result<Grammar, ApiError> {
        match self.ticket.wait().await {
            Ok(g) => Ok(g),
            Err(EngineError::InvalidGrammar { message, .. }) if self.from_response_format => {
                Err(ApiError::bad("response_format", message))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<AppState>>, body: Body) -> Response {
    let arrival = Instant::now();
    respond(
        async {
            let prep = on_pool(&st, body, prepare_completion).await?;
            st.run(prep, arrival).await
        }
        .await,
    )
}

/// Parses, tokenizes and checks a completions body (on the blocking pool).
fn prepare_completion(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let mut req: CompletionRequest = parse_generation(body, false, st.strict_request_fields)?;
    st.check_model(req.common.model.as_deref())?;
    st.request_limits
        .check(&req.common, st.engine.model_info().vocab_size)?;
    let logprobs = st.check_logprobs("logprobs", req.logprobs()?)?;
    st.generation_defaults.apply(&mut req.common);
    // Completions default to 16 tokens (OpenAI's and vLLM's default); chat to the room left.
    let mut params = sampling_params(
        &req.common,
        st.generation_defaults
            .cap_max_tokens(Some(req.common.max_tokens.unwrap_or(16))),
        logprobs,
        st.engine.model_info().vocab_size,
    )?;
    st.check_prompt_logprobs(params.prompt_logprobs)?;
    let n = req.common.n()?;
    let echo = req.echo.unwrap_or(false);
    if let Some(w) = &req.common.bad_words {
        params.bad_words_token_ids = st.bad_words_ids(w)?.into();
    }
    if echo && params.prompt_logprobs.is_none() {
        // vLLM: echoed prompt tokens get logprobs with as many alternatives as
        // the generated ones.
        params.prompt_logprobs = logprobs;
    }
    let add_special = req.common.add_special_tokens.unwrap_or(true);
    let trunc = req
        .common
        .truncation(st.engine.model_info().max_model_len)?;
    let texts_to_ids = |texts: Vec<String>| -> Result<Vec<Prompt>, ApiError> {
        texts
            .into_iter()
            .map(|t| Ok((st.encode_truncated(&t, add_special, trunc)?, Some(t))))
            .collect()
    };
    let mut prompts = match req.prompt {
        None => return Err(ApiError::bad("prompt", "`prompt` is required")),
        Some(PromptField::Text(t)) => texts_to_ids(vec![t])?,
        Some(PromptField::Texts(v)) => texts_to_ids(v)?,
        Some(PromptField::Tokens(ids)) => vec![(ids, None)],
        Some(PromptField::TokenLists(v)) => v.into_iter().map(|ids| (ids, None)).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt list is empty"));
    }
    for (ids, text) in &mut prompts {
        st.check_ids("prompt", ids)?;
        if !echo {
            *text = None;
        } else if text.is_none() {
            *text = Some(st.engine.tokenizer().decode(ids, false).unwrap_or_default());
        }
    }
    let ctx = st.ctx(Api::Completion, &req.common, logprobs.is_some());
    let priority = req.common.priority(st.priority_scheduling)?;
    let grammar = compile_grammar(st, &params, &req.common)?;
    Ok(Prepared {
        ctx,
        prompts,
        params,
        n,
        common: req.common,
        priority,
        grammar,
    })
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<Arc<AppState>>, body: Body) -> Response {
    let arrival = Instant::now();
    respond(
        async {
            let prep = on_pool(&st, body, prepare_chat).await?;
            st.run(prep, arrival).await
        }
        .await,
    )
}

/// Parses, renders, tokenizes and checks a chat body (on the blocking pool).
pub(super) fn prepare_chat(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let mut req: ChatRequest = parse_generation(body, true, st.strict_request_fields)?;
    st.check_model(req.common.model.as_deref())?;
    st.request_limits
        .check(&req.common, st.engine.model_info().vocab_size)?;
    let logprobs = st.check_logprobs("top_logprobs", req.logprobs()?)?;
    st.generation_defaults.apply(&mut req.common);
    let mut params = sampling_params(
        &req.common,
        st.generation_defaults.cap_max_tokens(req.max_tokens()),
        logprobs,
        st.engine.model_info().vocab_size,
    )?;
    st.check_prompt_logprobs(params.prompt_logprobs)?;
    if let Some(w) = &req.common.bad_words {
        params.bad_words_token_ids = st.bad_words_ids(w)?.into();
    }
    let n = req.common.n()?;
    let messages = match &req.messages {
        Some(m) if !m.is_empty() => m,
        _ => {
            return Err(ApiError::bad(
                "messages",
                "`messages` must be a non-empty list",
            ))
        }
    };
    let shaping = st.chat_shaping(&req, &mut params)?;
    let mode = chat_mode(req.add_generation_prompt, req.continue_final_message)?;
    let prompt = st.render_chat(
        messages,
        req.tools.as_ref(),
        mode,
        req.chat_template_kwargs.as_ref(),
    )?;
    // The template already wrote any special tokens it wants.
    let ids = st.encode(&prompt, req.common.add_special_tokens.unwrap_or(false))?;
    // vLLM's chat `echo`: the answer starts with the final message when it is the
    // assistant's own (what `continue_final_message` continues).
    let echo = match messages.last() {
        Some(m) if req.echo.unwrap_or(false) && m.role == "assistant" => Some(m.text()?),
        _ => None,
    };
    let mut ctx = st.ctx(Api::Chat, &req.common, logprobs.is_some());
    ctx.shaping = shaping;
    let priority = req.common.priority(st.priority_scheduling)?;
    let grammar = compile_grammar(st, &params, &req.common)?;
    Ok(Prepared {
        ctx,
        prompts: vec![(ids, echo)],
        params,
        n,
        common: req.common,
        priority,
        grammar,
    })
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let info = st.engine.model_info();
    // Every --served-model-name is listed, as vLLM lists its base model paths.
    let names = std::iter::once(&st.model_name).chain(&st.served_aliases);
    let data: Vec<_> = names
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": st.created,
                "owned_by": "pagoda",
                "root": info.name,
                "parent": null,
                "max_model_len": info.max_model_len,
                "permission": [],
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /health`: 200 with an empty body, or 503 (vLLM's answer once its engine is
/// dead, which routers and probes act on) with an error object naming the fault.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.engine.health() {
        Ok(()) => StatusCode::OK.into_response(),
        // A stopped engine is as unhealthy as a faulted one: probes must see 503.
        Err(e) => ApiError::Unavailable {
            message: e.to_string(),
        }
        .into_response(),
    }
}

/// `GET /version`.
pub async fn version() -> Response {
    Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.metrics.render(&st.engine.rank_stats(), &st.model_name);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `POST /tokenize`: a prompt, or chat messages rendered by the template.
pub async fn tokenize(State(st): State<Arc<AppState>>, body: Body) -> Response {
    respond(on_pool(&st, body, tokenize_inner).await)
}

fn tokenize_inner(st: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse_body(body)?;
    st.check_model(req.model.as_deref())?;
    let ids = match (&req.prompt, &req.messages) {
        (Some(p), None) => st.encode(p, req.add_special_tokens.unwrap_or(true))?,
        (None, Some(m)) => {
            let mode = chat_mode(req.add_generation_prompt, req.continue_final_message)?;
            let text = st.render_chat(
                m,
                req.tools.as_ref(),
                mode,
                req.chat_template_kwargs.as_ref(),
            )?;
            st.encode(&text, req.add_special_tokens.unwrap_or(false))?
        }
        _ => {
            return Err(ApiError::bad(
                "prompt",
                "give exactly one of `prompt` and `messages`",
            ))
        }
    };
    // The vocabulary's own strings (`"Ġis"`), as vLLM returns them, not decoded text.
    let token_strs = req.return_token_strs.unwrap_or(false).then(|| {
        let tok = st.engine.tokenizer();
        ids.iter()
            .map(|&id| tok.id_to_token(id).unwrap_or_default())
            .collect::<Vec<_>>()
    });
    Ok(Json(json!({
        "count": ids.len(),
        "max_model_len": st.engine.model_info().max_model_len,
        "tokens": ids,
        "token_strs": token_strs,
    }))
    .into_response())
}

/// `POST /detokenize`.
pub async fn detokenize(State(st): State<Arc<AppState>>, body: Body) -> Response {
    respond(on_pool(&st, body, detokenize_inner).await)
}

fn detokenize_inner(st: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse_body(body)?;
    st.check_model(req.model.as_deref())?;
    let ids = req
        .tokens
        .ok_or_else(|| ApiError::bad("tokens", "`tokens` is required"))?;
    st.check_ids("tokens", &ids)?;
    let text = st
        .engine
        .tokenizer()
        .decode(&ids, false)
        .map_err(|e| ApiError::bad("tokens", format!("cannot decode: {e}")))?;
    Ok(Json(json!({"prompt": text})).into_response())
}

/// Unknown routes.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::NotFound {
        message: format!("no route for {}", uri.path()),
    }
    .into_response()
}

pub async fn method_not_allowed() -> Response {
    ApiError::MethodNotAllowed.into_response()
}
