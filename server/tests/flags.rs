//! vLLM's `serve` flags and the endpoints behind them, end to end on the real
//! binary and model: each check fails if its flag does nothing.

mod common;

use common::{assert_error, metric, model_path, reference, Server};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::Duration;

fn pagoda(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("PAGODA_MODEL")
        .stdin(Stdio::null())
        .output()
        .expect("running pagoda")
}

/// `pagoda serve` with these flags must exit at once with an error naming `want`.
fn refused(extra: &[&str], want: &[&str]) {
    let model = model_path();
    let mut args = vec!["serve", "--port", "0", "--model", model.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = pagoda(&args);
    assert!(!out.status.success(), "{extra:?} was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    for w in want {
        assert!(err.contains(w), "{extra:?}: `{w}` missing from\n{err}");
    }
}

#[test]
fn bad_flag_values_are_clear_errors() {
    refused(
        &["-tp", "2"],
        &["--tensor-parallel-size 2", "valid value: 1"],
    );
    refused(&["--tensor-parallel-size=4"], &["valid value: 1"]);
    refused(
        &["--kv-cache-dtype", "fp8_e5m2"],
        &[
            "--kv-cache-dtype",
            "fp8_e5m2",
            "not implemented",
            "valid values: auto",
        ],
    );
    refused(
        &["--dtype", "half"],
        &["--dtype half", "auto, float32", "bfloat16"],
    );
    refused(&["--gpu-memory-utilization", "1.5"], &["(0, 1]"]);
    refused(&["--gpu-memory-utilization", "0"], &["(0, 1]"]);
    refused(
        &["--chat-template", "/no/such/template.jinja"],
        &["--chat-template", "looks like a file path"],
    );
    refused(
        &["--generation-config", "/no/such/dir"],
        &["--generation-config", "generation_config.json"],
    );
    refused(&["--uvicorn-log-level", "loud"], &["critical", "warning"]);
    refused(&["--max-logprobs", "5000"], &["--max-logprobs 5000"]);
}

#[test]
fn help_groups_flags_as_vllm() {
    let out = pagoda(&["serve", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    // Each group heading, in vLLM's order, with one of its flags after it and
    // before the next heading.
    let groups = [
        ("ModelConfig:", "--served-model-name"),
        ("CacheConfig:", "--gpu-memory-utilization"),
        ("SchedulerConfig:", "--enable-chunked-prefill"),
        ("ParallelConfig:", "--tensor-parallel-size"),
        ("Frontend:", "--enable-request-id-headers"),
    ];
    let mut last = 0;
    for (i, (heading, flag)) in groups.iter().enumerate() {
        let at = help[last..]
            .find(heading)
            .map(|p| p + last)
            .unwrap_or_else(|| panic!("{heading} missing or out of order:\n{help}"));
        let end = groups
            .get(i + 1)
            .and_then(|(h, _)| help.find(h))
            .unwrap_or(help.len());
        assert!(
            help[at..end].contains(flag),
            "{flag} is not under {heading}:\n{help}"
        );
        last = at;
    }
    assert!(help.contains("[MODEL]"), "positional model:\n{help}");
}

/// A server started by hand (the model positional, no `--model`).
struct Manual {
    child: std::process::Child,
    base: String,
    log: std::path::PathBuf,
}

impl Drop for Manual {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn start_manual(args: &[&str]) -> Manual {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::env::temp_dir().join(format!("pagoda-flags-{}-{port}.log", std::process::id()));
    let child = Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .arg("serve")
        .args(args)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .env_remove("PAGODA_MODEL")
        .env_remove("PAGODA_API_KEY")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let m = Manual {
        child,
        base: format!("http://127.0.0.1:{port}"),
        log,
    };
    for _ in 0..3000 {
        if ureq::get(&format!("{}/health", m.base)).call().is_ok() {
            return m;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "server did not start:\n{}",
        std::fs::read_to_string(&m.log).unwrap_or_default()
    );
}

fn get_json(url: &str) -> Value {
    serde_json::from_str(&ureq::get(url).call().unwrap().into_string().unwrap()).unwrap()
}

fn post_json(r: ureq::Request, body: &Value) -> ureq::Response {
    r.set("Content-Type", "application/json")
        .send_string(&body.to_string())
        .unwrap()
}

#[test]
fn positional_model_and_vllm_cache_flags() {
    let model = model_path();
    let s = start_manual(&[
        model.to_str().unwrap(),
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--gpu-memory-utilization",
        "0.5",
        "-tp",
        "1",
        "--kv-cache-dtype",
        "auto",
        "--dtype",
        "auto",
        "--disable-log-stats",
        "--disable-uvicorn-access-log",
        "--disable-fastapi-docs",
        "--enable-prompt-tokens-details",
    ]);
    let models = get_json(&format!("{}/v1/models", s.base));
    assert_eq!(
        models["data"][0]["id"],
        model.file_stem().unwrap().to_str().unwrap(),
        "{models}"
    );
    // Prefix caching off: a repeated long prompt gets no hits.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    for _ in 0..2 {
        let resp = post_json(
            ureq::post(&format!("{}/v1/completions", s.base)),
            &json!({"prompt": prompt, "max_tokens": 1}),
        );
        let r: Value = serde_json::from_str(&resp.into_string().unwrap()).unwrap();
        assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let text = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        text.contains("enable_prefix_caching=\"False\"")
            && text.contains("gpu_memory_utilization=\"0.5\""),
        "{text}"
    );
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("--gpu-memory-utilization 0.5: no effect on the CPU engine")
            && log.contains("serving model"),
        "{log}"
    );
}

#[test]
fn kv_cache_dtypes_bf16_and_fp8_serve_and_multiply_the_blocks() {
    // SmolLM2: 30 layers x (K, V) x 16 tokens x 3 KV heads x 64 dims; a block is
    // 737280 bytes in f32, 368640 in bf16, 184320 in fp8: 64 MiB hold 91 f32 blocks,
    // 182 bf16 ones, 364 fp8 ones.
    let blocks = |dtype: &str, label: &str| {
        let s = Server::start(&["--kv-cache-dtype", dtype, "--kv-cache-memory-mib", "64"]);
        let r = s.post_ok(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Name a colour."}],
                    "max_tokens": 8, "temperature": 0}),
        );
        let text = r["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(!text.is_empty(), "{r}");
        let (_, m) = s.get("/metrics");
        assert!(m.contains(&format!("cache_dtype=\"{label}\"")), "{m}");
        let at = m.find("num_gpu_blocks=\"").unwrap() + "num_gpu_blocks=\"".len();
        m[at..].split('"').next().unwrap().parse::<usize>().unwrap()
    };
    assert_eq!(blocks("bf16", "bfloat16"), 182);
    assert_eq!(blocks("fp8", "fp8_e4m3"), 364);
    assert_eq!(blocks("auto", "auto"), 91);
}

#[test]
fn backends_command_shows_which_backend_takes_which_kv_dtype() {
    let model = model_path();
    let out = pagoda(&[
        "backends",
        "--model",
        model.to_str().unwrap(),
        "--kv-cache-dtype",
        "bf16",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| {
        s.lines()
            .find(|l| {
                let mut w = l.split_whitespace();
                w.next() == Some(name) && w.next() == Some("cpu")
            })
            .unwrap_or_else(|| panic!("no dtype row for {name}:\n{s}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    // backend, devices, q dtypes, kv dtypes, rows
    assert_eq!(row("paged")[3], "f32,bf16,f16,fp8_e4m3", "{s}");
    assert_eq!(row("flash")[3], "f32,bf16,f16,fp8_e4m3", "{s}");
    assert_eq!(row("naive")[3], "f32,f16,bf16,fp8_e4m3", "{s}");
    assert_eq!(row("example")[3], "f32", "{s}");
    assert!(s.contains("kv cache bf16"), "{s}");
    assert!(s.contains("choice: decode=paged,prefill=flash"), "{s}");
    // A forced backend without a bf16 cache is refused with that reason.
    let out = pagoda(&[
        "backends",
        "--model",
        model.to_str().unwrap(),
        "--kv-cache-dtype",
        "bf16",
        "--attention-backend",
        "example",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        s.contains("KV cache dtype bf16 is not supported (supported: f32)"),
        "{s}"
    );
}

/// Two sampled completions without a seed, in sequence.
fn two_samples(s: &Server) -> Vec<String> {
    (0..2)
        .map(|_| {
            let r = s.post_ok(
                "/v1/completions",
                &json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.5}),
            );
            r["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn engine_seed_makes_a_run_reproducible() {
    let a = two_samples(&Server::start(&["--seed", "7"]));
    assert_ne!(a[0], a[1], "successive requests draw different seeds");
    let b = two_samples(&Server::start(&[
        "--seed",
        "7",
        "--no-enable-chunked-prefill",
    ]));
    assert_eq!(a, b, "the same --seed replays the same samples");
    let c = two_samples(&Server::start(&["--seed", "8"]));
    assert_ne!(a, c, "another --seed samples differently");
}

#[test]
fn generation_config_sets_request_defaults() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"temperature": 0.0, "top_k": 50, "max_new_tokens": 5, "do_sample": true}"#,
    )
    .unwrap();
    let s = Server::start(&["--generation-config", dir.path().to_str().unwrap()]);
    let case = &reference()["cases"][0];
    let prompt = case["prompt"].as_str().unwrap();
    let greedy: Vec<u64> = case["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    // No temperature, no max_tokens: greedy (temperature 0) and capped at 5 tokens.
    for seed in [1, 2] {
        let r = s.post_ok(
            "/v1/completions",
            &json!({"prompt": prompt, "seed": seed, "return_token_ids": true}),
        );
        let ids: Vec<u64> = r["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(ids, greedy[..5], "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "length");
    }
    // The request's own values win; max_new_tokens stays a cap.
    let r = s.post_ok(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 3}),
    );
    assert_eq!(r["usage"]["completion_tokens"], 3);
    let r = s.post_ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 50}),
    );
    assert!(
        r["usage"]["completion_tokens"].as_u64().unwrap() <= 5,
        "{r}"
    );
}

#[test]
fn defaults_keep_optional_endpoints_off() {
    // f32 weights (no endpoint depends on them): the batch check compares greedy
    // text across different splits of a prompt over steps (batching, prefix-cache
    // hits), which quantized weights' int8 activations do not keep (see
    // models/tests/llama_real.rs, `smollm2_prompt_split_across_steps_matches_one_step`).
    let s = Server::start(&["--dtype", "float32"]);
    let (st, body) = s.get("/tokenizer_info");
    assert_error(st, &body, 404, "/tokenizer_info without its flag");
    // `/load` exists (as in vLLM) but counts nothing without tracking.
    assert_eq!(get_json(&s.url("/load")), json!({"server_load": 0}));
    let resp = ureq::get(&s.url("/v1/models"))
        .set("X-Request-Id", "abc")
        .call()
        .unwrap();
    assert!(resp.header("x-request-id").is_none());
    assert_eq!(ureq::get(&s.url("/ping")).call().unwrap().status(), 200);
    assert_eq!(ureq::post(&s.url("/ping")).call().unwrap().status(), 200);
    batched_chat(&s);
}

/// vLLM's `/v1/chat/completions/batch`: one choice per conversation, each as the
/// single-conversation endpoint answers it.
fn batched_chat(s: &Server) {
    let convs = [
        json!([{"role": "user", "content": "What is the capital of France?"}]),
        json!([{"role": "user", "content": "Name a color."}]),
    ];
    let batch = s.post_ok(
        "/v1/chat/completions/batch",
        &json!({"messages": convs, "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(batch["object"], "chat.completion", "{batch}");
    let choices = batch["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{batch}");
    let mut prompt_tokens = 0;
    for (i, conv) in convs.iter().enumerate() {
        let one = s.post_ok(
            "/v1/chat/completions",
            &json!({"messages": conv, "max_tokens": 6, "temperature": 0}),
        );
        assert_eq!(choices[i]["index"], i);
        assert_eq!(
            choices[i]["message"]["content"], one["choices"][0]["message"]["content"],
            "conversation {i}"
        );
        prompt_tokens += one["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    assert_eq!(batch["usage"]["prompt_tokens"], prompt_tokens);
    let (st, v) = s.post(
        "/v1/chat/completions/batch",
        &json!({"messages": convs, "stream": true}),
    );
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.post(
        "/v1/chat/completions/batch",
        &json!({"messages": [{"role": "user", "content": "flat"}]}),
    );
    assert_eq!(st, 400, "{v}");
}

const TEMPLATE: &str = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\\n{% endfor %}";

#[test]
fn frontend_flags_end_to_end() {
    let s = Server::start(&[
        "--served-model-name",
        "first",
        "second",
        "--enable-server-load-tracking",
        "--enable-tokenizer-info-endpoint",
        "--enable-request-id-headers",
        "--enable-log-requests",
        "--return-tokens-as-token-ids",
        "--enable-force-include-usage",
        "--max-logprobs",
        "3",
        "--chat-template",
        TEMPLATE,
        "--uvicorn-log-level",
        "warning",
    ]);
    served_model_names(&s);
    request_id_headers(&s);
    server_load(&s);
    tokenizer_info_and_chat_template(&s);
    max_logprobs_and_token_ids(&s);
    force_include_usage(&s);
    invocations(&s);
    let log = s.log_text();
    assert!(
        log.contains("Received request cmpl-") && log.contains("prompt tokens: "),
        "--enable-log-requests logs requests:\n{log}"
    );
    // `--uvicorn-log-level warning` quiets the HTTP layer's info lines.
    assert!(!log.contains("serving model `first`"), "{log}");
}

fn served_model_names(s: &Server) {
    let models = get_json(&s.url("/v1/models"));
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["first", "second"]);
    let r = s.post_ok(
        "/v1/completions",
        &json!({"model": "second", "prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(r["model"], "first", "responses report the first name");
    let (st, v) = s.post(
        "/v1/completions",
        &json!({"model": "third", "prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(st, 404, "{v}");
    let text = s.get("/metrics").1;
    assert!(text.contains("model_name=\"first\",engine=\"0\""), "{text}");
}

fn request_id_headers(s: &Server) {
    let resp = post_json(
        ureq::post(&s.url("/v1/completions")).set("X-Request-Id", "my-id-42"),
        &json!({"prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(resp.header("x-request-id"), Some("my-id-42"));
    let resp = ureq::get(&s.url("/health")).call().unwrap();
    let id = resp.header("x-request-id").expect("a generated id");
    assert!(
        id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
}

fn server_load(s: &Server) {
    assert_eq!(get_json(&s.url("/load")), json!({"server_load": 0}));
    let mut stream = s.open_stream(
        "/v1/completions",
        &json!({"prompt": "Count to a thousand:", "max_tokens": 400, "ignore_eos": true, "stream": true}),
    );
    assert!(stream.next_event().is_some());
    assert_eq!(get_json(&s.url("/load")), json!({"server_load": 1}));
    while stream.next_event().is_some() {}
    assert!(stream.done);
    let mut load = Value::Null;
    for _ in 0..50 {
        load = get_json(&s.url("/load"));
        if load == json!({"server_load": 0}) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        load,
        json!({"server_load": 0}),
        "counted until the stream ended"
    );
}

fn tokenizer_info_and_chat_template(s: &Server) {
    let info = get_json(&s.url("/tokenizer_info"));
    assert_eq!(info["tokenizer_class"], "PreTrainedTokenizerFast", "{info}");
    assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
    assert!(info["model_max_length"].as_u64().unwrap() > 0);
    let expected = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    assert_eq!(info["chat_template"], expected, "inline --chat-template");
    // The template renders chat prompts.
    let chat = s.post_ok(
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false}),
    );
    let plain = s.post_ok(
        "/tokenize",
        &json!({"prompt": "[user] hi\n", "add_special_tokens": false}),
    );
    assert_eq!(chat["tokens"], plain["tokens"]);
}

fn max_logprobs_and_token_ids(s: &Server) {
    let (st, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1, "logprobs": 4}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(
        v["error"]["message"],
        "Requested sample logprobs of 4, which is greater than max allowed: 3"
    );
    let (st, v) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                "logprobs": true, "top_logprobs": -1}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("greater than max allowed: 3"),
        "{v}"
    );
    let r = s.post_ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "logprobs": 3}),
    );
    let tokens = r["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2);
    for t in tokens {
        assert!(
            t.as_str().unwrap().starts_with("token_id:"),
            "--return-tokens-as-token-ids: {r}"
        );
    }
}

fn force_include_usage(s: &Server) {
    let events = s.stream(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3, "stream": true}),
    );
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    assert_eq!(last["usage"]["completion_tokens"], 3, "{last}");
}

fn invocations(s: &Server) {
    let chat = s.post_ok(
        "/invocations",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert_eq!(chat["object"], "chat.completion", "{chat}");
    let cmpl = s.post_ok("/invocations", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(cmpl["object"], "text_completion", "{cmpl}");
    let (st, v) = s.post("/invocations", &json!({"input": "Hi"}));
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Cannot find suitable handler for request"),
        "{v}"
    );
    // Generation requests through /invocations count in the metrics too.
    let text = s.get("/metrics").1;
    assert!(metric(&text, "vllm:request_prompt_tokens_count").unwrap() >= 2.0);
}
