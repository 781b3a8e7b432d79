//! The model families beyond Llama (Qwen2, Qwen3, Mistral, Gemma 2, Mixtral) against
//! transformers: the fixtures in `tests/data/families/` were made by
//! `scripts/fixtures/make_families.py` (tiny random-weight models, transformers'
//! logits and greedy ids recorded next to them). Each family is loaded from its HF
//! directory and from its GGUF, and run in f32 through the paged KV cache with the
//! automatically selected backends (`paged` decode, `flash` prefill) and with
//! `naive`: whole prompts batched together, prompts in chunks, and a prefill chunk
//! beside decodes; then through the engine (scheduler, runner) for greedy ids.

use pagoda_core::{
    AttentionBackend, BatchDescriptor, Constraint, KvCache, KvCacheSpec, SamplingParams, StepBatch,
    StructuredOutputs,
};
use pagoda_engine::{EngineConfig, LLMEngine, PromptInput};
use pagoda_models::{load_model, merge_attention_configs, ChatMessage, ForwardScratch, Llama};
use pagoda_selector::{select, BackendOverride};
use serde::Deserialize;
use std::path::{Path, PathBuf};

// Inventory only sees linked crates: link every backend.
use pagoda_backends as _;

const FAMILIES: [&str; 5] = ["qwen2", "qwen3", "mistral", "gemma2", "mixtral"];
const BLOCK: usize = 4;
/// Transformers' f32 logits against ours: the bound the issue sets.
const TOL: f32 = 1e-4;

#[derive(Deserialize)]
struct Prompt {
    text: String,
    ids: Vec<u32>,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
    greedy_last_logits: Vec<f32>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    rendered: String,
}

/// What the `sentencepiece` package itself gave (SentencePiece families only).
#[derive(Deserialize)]
struct SentencePiece {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct Reference {
    architecture: String,
    prompts: Vec<Prompt>,
    corpus_ids: Vec<u32>,
    chat: Chat,
    sentencepiece: Option<SentencePiece>,
}

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/families")
        .join(family)
}

fn reference(family: &str) -> Reference {
    let p = dir(family).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// Both sources of a family: the HF directory and the GGUF file.
fn sources(family: &str) -> [PathBuf; 2] {
    [dir(family), dir(family).join(format!("{family}.gguf"))]
}

/// A step: rows `(request, query length)`, in any order (decode rows go first).
type Step = Vec<(usize, usize)>;

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: vocab");
    let (i, d) = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0.0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
    assert!(
        d <= TOL,
        "{what}: logit {i} is {} vs transformers' {} (|diff| {d} > {TOL})",
        got[i],
        want[i]
    );
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs `schedule` over the sequences `prompt ids + greedy[..n-1]` and checks the
/// logits of each prompt's last token and of the last greedy step against
/// transformers', and every greedy step's argmax.
fn run_schedule(model: &Llama, refs: &Reference, schedule: &[Step], forced: &str, label: &str) {
    let c = model.config();
    let seqs: Vec<Vec<u32>> = refs
        .prompts
        .iter()
        .map(|p| {
            let mut s = p.ids.clone();
            s.extend_from_slice(&p.greedy[..p.greedy.len() - 1]);
            s
        })
        .collect();
    let configs = model.attention_configs(BLOCK);
    let selection = select(
        &merge_attention_configs(&configs),
        &BackendOverride::parse(forced).unwrap(),
    )
    .unwrap();
    let mut attn: Vec<Box<dyn AttentionBackend>> = configs
        .iter()
        .map(|cfg| selection.build(cfg).unwrap())
        .collect();
    let num_blocks = 1 + seqs.iter().map(|s| s.len().div_ceil(BLOCK)).sum::<usize>();
    let spec = KvCacheSpec {
        num_layers: c.num_layers,
        num_blocks,
        block_size: BLOCK,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        dtype: pagoda_core::DType::F32,
    };
    // NaN everywhere: a read of a slot nobody wrote poisons the logits.
    let mut kv = KvCache::filled(spec, f32::NAN);
    // Blocks handed out back to front, so requests' blocks interleave in the pool.
    let mut next = num_blocks as u32;
    let tables: Vec<Vec<u32>> = seqs
        .iter()
        .map(|s| {
            (0..s.len().div_ceil(BLOCK))
                .map(|_| {
                    next -= 1;
                    next
                })
                .collect()
        })
        .collect();
    let mut done = vec![0usize; seqs.len()];
    let (mut scratch, mut logits) = (ForwardScratch::default(), Vec::new());
    let mut checks = 0;
    for step in schedule {
        let mut rows = step.clone();
        rows.sort_by_key(|&(_, q)| q != 1);
        let (mut ids, mut pos, mut qlens, mut slens, mut brows, mut last) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for &(r, q) in &rows {
            let start = done[r];
            ids.extend_from_slice(&seqs[r][start..start + q]);
            pos.extend((start..start + q).map(|p| p as u32));
            last.push((ids.len() - 1, r, start + q - 1));
            qlens.push(q);
            slens.push(start + q);
            brows.push(&tables[r][..(start + q).div_ceil(BLOCK)]);
            done[r] += q;
        }
        let batch = BatchDescriptor::new(BLOCK, &qlens, &slens, &brows).unwrap();
        for a in &mut attn {
            a.plan(&batch).unwrap();
        }
        let logits_rows: Vec<usize> = last.iter().map(|x| x.0).collect();
        model
            .forward_kinds(
                &StepBatch {
                    input_ids: &ids,
                    positions: &pos,
                    batch: &batch,
                    logits_rows: &logits_rows,
                },
                &mut attn,
                &mut kv,
                &mut logits,
                &mut scratch,
            )
            .unwrap();
        for (i, &(_, r, p)) in last.iter().enumerate() {
            let row = &logits[i * c.vocab_size..(i + 1) * c.vocab_size];
            let pr = &refs.prompts[r];
            let what = format!("[{label}] prompt {:?} position {p}", pr.text);
            if p + 1 >= pr.ids.len() {
                let g = p + 1 - pr.ids.len(); // the greedy token these logits pick
                assert_eq!(argmax(row), pr.greedy[g], "{what}: greedy token {g}");
                checks += 1;
            }
            if p + 1 == pr.ids.len() {
                assert_close(row, &pr.last_logits, &what);
            }
            if p + 1 == seqs[r].len() {
                assert_close(row, &pr.greedy_last_logits, &what);
            }
        }
    }
    for (r, s) in seqs.iter().enumerate() {
        assert_eq!(
            done[r],
            s.len(),
            "[{label}] the schedule must cover request {r}"
        );
    }
    assert!(checks > 0);
}

/// All prompts together in one step, then decodes of all three together.
fn batched(lens: &[usize], total: &[usize]) -> Vec<Step> {
    let mut steps = vec![lens.iter().enumerate().map(|(r, &l)| (r, l)).collect()];
    let decodes = total[0] - lens[0];
    for _ in 0..decodes {
        steps.push((0..lens.len()).map(|r| (r, 1)).collect());
    }
    steps
}

/// Prompts in chunks of `chunk` tokens, one request's prefill at a time (a last
/// chunk of one token is a decode row); requests whose prompt is done decode one
/// token per step beside the next request's chunks (mixed batches).
fn chunked(lens: &[usize], total: &[usize], chunk: usize) -> Vec<Step> {
    let n = lens.len();
    let mut done = vec![0usize; n];
    let mut steps = Vec::new();
    loop {
        let mut step: Step = Vec::new();
        if let Some(r) = (0..n).find(|&r| done[r] < lens[r]) {
            let q = chunk.min(lens[r] - done[r]);
            step.push((r, q));
            done[r] += q;
        }
        for r in 0..n {
            if done[r] >= lens[r] && done[r] < total[r] && !step.iter().any(|x| x.0 == r) {
                step.push((r, 1));
                done[r] += 1;
            }
        }
        if step.is_empty() {
            return steps;
        }
        steps.push(step);
    }
}

fn check_family(family: &str) {
    let refs = reference(family);
    let lens: Vec<usize> = refs.prompts.iter().map(|p| p.ids.len()).collect();
    let total: Vec<usize> = refs
        .prompts
        .iter()
        .map(|p| p.ids.len() + p.greedy.len() - 1)
        .collect();
    for path in sources(family) {
        let src = if path.is_dir() { "hf" } else { "gguf" };
        let m = load_model(&path).unwrap_or_else(|e| panic!("{family} {src}: {e}"));
        assert_eq!(
            m.config.arch.architecture.hf_name(),
            refs.architecture,
            "{family} {src}: detected architecture"
        );
        for p in &refs.prompts {
            assert_eq!(
                m.tokenizer.encode(&p.text, true).unwrap(),
                p.ids,
                "{family} {src}: token ids of {:?}",
                p.text
            );
        }
        let model = Llama::new(m.config, m.weights).unwrap();
        for forced in ["auto", "naive"] {
            let l = format!("{family} {src} {forced}");
            run_schedule(
                &model,
                &refs,
                &batched(&lens, &total),
                forced,
                &format!("{l} batched"),
            );
            run_schedule(
                &model,
                &refs,
                &chunked(&lens, &total, 5),
                forced,
                &format!("{l} chunked"),
            );
        }
    }
}

#[test]
fn qwen2_matches_transformers() {
    check_family("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check_family("qwen3");
}

#[test]
fn mistral_matches_transformers() {
    check_family("mistral");
}

#[test]
fn gemma2_matches_transformers() {
    check_family("gemma2");
}

#[test]
fn mixtral_matches_transformers() {
    check_family("mixtral");
}

/// The engine (scheduler, runner, selected backends) reproduces transformers'
/// greedy ids for every family, from both sources, with a small token budget so
/// prompts are chunked.
#[test]
fn engine_greedy_ids_match_transformers() {
    for family in FAMILIES {
        let refs = reference(family);
        for path in sources(family) {
            let mut c = EngineConfig::new(&path);
            c.kv_cache_bytes = 8 << 20;
            c.block_size = BLOCK;
            c.max_num_batched_tokens = 16;
            c.disable_log_stats = true;
            let mut engine = LLMEngine::new(c).unwrap_or_else(|e| panic!("{family}: {e}"));
            let prompts: Vec<PromptInput> = refs
                .prompts
                .iter()
                .map(|p| PromptInput::Text(p.text.clone()))
                .collect();
            // transformers generated past EOS (the fixtures are random models).
            let mut params = SamplingParams::greedy(refs.prompts[0].greedy.len());
            params.ignore_eos = true;
            let outs = engine.generate(&prompts, &params).unwrap();
            for (p, o) in refs.prompts.iter().zip(&outs) {
                assert_eq!(o.prompt_token_ids, p.ids, "{family} {}", path.display());
                assert_eq!(
                    o.token_ids,
                    p.greedy,
                    "{family} {}: greedy ids",
                    path.display()
                );
            }
        }
    }
}

/// Both tokenizers of a family (tokenizer.json and the GGUF vocabulary) give
/// transformers' ids on the whole corpus (digits, emoji, whitespace runs).
#[test]
fn tokenizers_match_on_the_corpus() {
    let corpus = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fixtures/corpus.txt"),
    )
    .unwrap();
    for family in FAMILIES {
        let refs = reference(family);
        for path in sources(family) {
            let m = load_model(&path).unwrap();
            assert_eq!(
                m.tokenizer.encode(&corpus, false).unwrap(),
                refs.corpus_ids,
                "{family} {}",
                path.display()
            );
        }
    }
}

/// Mistral and Gemma 2 carry SentencePiece tokenizers (`tokenizer.model` trained by
/// the `sentencepiece` package; in GGUF a `llama` vocabulary with scores, token
/// types and `add_space_prefix`, in the HF directory the `tokenizer.json` layout of
/// those models). Both sources give sentencepiece's own ids on a text of digits,
/// emoji, whitespace runs, newlines and characters outside the vocabulary (byte
/// fallback), and decode them back as sentencepiece does.
#[test]
fn sentencepiece_families_match_sentencepiece() {
    let mut checked = 0;
    for family in FAMILIES {
        let Some(sp) = reference(family).sentencepiece else {
            continue;
        };
        for path in sources(family) {
            let m = load_model(&path).unwrap();
            let what = format!("{family} {}", path.display());
            assert_eq!(
                m.tokenizer.encode(&sp.text, false).unwrap(),
                sp.ids,
                "{what}"
            );
            assert_eq!(
                m.tokenizer.decode(&sp.ids, true).unwrap(),
                sp.decoded,
                "{what}"
            );
            assert_eq!(sp.decoded, sp.text, "{what}: byte fallback loses nothing");
            // With special tokens: BOS first, nothing at the end (add_eos is false).
            let with_bos = m.tokenizer.encode(&sp.text, true).unwrap();
            assert_eq!(Some(with_bos[0]), m.tokenizer.bos_token_id(), "{what}");
            assert_eq!(&with_bos[1..], &sp.ids[..], "{what}");
        }
        checked += 1;
    }
    assert_eq!(
        checked, 2,
        "mistral and gemma2 are the SentencePiece fixtures"
    );
}

/// Structured outputs run on the GGUF SentencePiece tokenizers (llguidance reads the
/// HF tokenizer built beside the encoder: `▁` for spaces, `<0xNN>` byte fallback):
/// choices with characters outside the vocabulary (reachable only through byte
/// tokens), space and tab runs, and a regex, for greedy generation.
#[test]
fn structured_outputs_with_sentencepiece_gguf() {
    let choices = ["July 4, 1776", "漢字 🦀 end", "  spaced\tout"];
    let whole = regex::Regex::new("^[0-9]{3} [a-z]{1,4} ü$").unwrap();
    for family in ["mistral", "gemma2"] {
        let path = dir(family).join(format!("{family}.gguf"));
        let mut c = EngineConfig::new(&path);
        c.kv_cache_bytes = 8 << 20;
        c.block_size = BLOCK;
        c.disable_log_stats = true;
        let mut engine = LLMEngine::new(c).unwrap_or_else(|e| panic!("{family}: {e}"));
        let prompts = [PromptInput::Text("When in the Course".into())];
        for (constraint, ok) in [
            (
                Constraint::Choice(choices.iter().map(|c| c.to_string()).collect()),
                Box::new(|t: &str| choices.contains(&t)) as Box<dyn Fn(&str) -> bool>,
            ),
            (
                Constraint::Regex("[0-9]{3} [a-z]{1,4} ü".into()),
                Box::new(|t: &str| whole.is_match(t)),
            ),
        ] {
            let params = SamplingParams {
                structured_outputs: Some(StructuredOutputs::new(constraint).into()),
                ..SamplingParams::greedy(24)
            };
            let out = &engine.generate(&prompts, &params).unwrap()[0];
            assert!(
                ok(&out.text),
                "{family}: {:?} ({:?})",
                out.text,
                out.token_ids
            );
        }
    }
}

/// Each family's own chat template (tokenizer_config.json / chat_template.jinja, and
/// GGUF `tokenizer.chat_template`) renders as transformers renders it; templates
/// that refuse a conversation (`raise_exception`) refuse it here too.
#[test]
fn chat_templates_render_as_transformers() {
    for family in FAMILIES {
        let refs = reference(family);
        for path in sources(family) {
            let m = load_model(&path).unwrap();
            let t = m
                .chat_template
                .as_ref()
                .expect("the fixture has a template");
            assert_eq!(
                t.render(&refs.chat.messages, true).unwrap(),
                refs.chat.rendered,
                "{family} {}",
                path.display()
            );
            if matches!(family, "mistral" | "mixtral" | "gemma2") {
                let two_users = [refs.chat.messages[0].clone(), refs.chat.messages[0].clone()];
                let e = t.render(&two_users, true).unwrap_err().to_string();
                assert!(e.contains("alternate"), "{family}: {e}");
            }
        }
    }
}

/// A model that needs a sliding window, forced onto a backend without one, does
/// not start, and the error says why.
#[test]
fn a_forced_backend_lacking_a_needed_feature_is_refused() {
    let mut c = EngineConfig::new(dir("mistral"));
    c.kv_cache_bytes = 8 << 20;
    c.attention_backend = Some("example".into());
    let e = LLMEngine::new(c)
        .err()
        .expect("must be refused")
        .to_string();
    assert!(e.contains("sliding-window"), "{e}");
}
