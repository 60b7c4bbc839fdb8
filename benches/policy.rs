//! Micro-benchmark of the policy core: what the filter computes per completion request,
//! stage by stage, per prompt size. Standard library only, so the same program runs
//! natively and as `wasm32-wasip1` under wasmtime or V8 (`pinroute-lab bench` builds
//! and runs all three; `cargo bench --bench policy` runs it natively).
//!
//! Arguments: `--sizes 1024,32768,262144` (request body bytes), `--budget-ms 300` (time per
//! measurement). Output: one JSON object per line,
//! `{"stage": "parse", "body_bytes": 1024, "ns_per_op": 812.5, "iterations": 120000}`.
//!
//! Stages, in the order the filter runs them on a request body:
//! - `headers`: the pin headers (`parse_headers`) of a typical request;
//! - `parse`: `JsonObject::parse` of the body and `parse_nvext`;
//! - `resolve`: `Resolver::resolve` of a pinned prefill and decode worker;
//! - `prefill_body`: the prefill hop's body (`rewrite::prefill_body`);
//! - `decode_body`: the edit that makes the held body the decode hop's (`DecodeBody::new` +
//!   `finish` with the prefill's `kv_transfer_params`);
//! - `prefill_response`: reading `kv_transfer_params` from the prefill's answer;
//! - `total`: all of the above, as one request;
//! - `unpinned`: resolving both hops of an unpinned request by load alone, as before prefix
//!   affinity (not in `total`);
//! - `affinity`: the same request placed by prefix affinity (`docs/semantics.md` §5):
//!   hashing the prompt's beginning and walking its depths over the loads. `affinity`
//!   minus `unpinned` is what affinity adds.
//!
//! The registry-size axis, `--pools 1,10,100,1000` (workers per pool): `unpinned N+N` and
//! `affinity N+N` are the last two stages on a registry of N prefill and N decode workers,
//! with an 8 KB body (its prompt is placed by its whole 4 KB prefix window). What grows with
//! N is what a hop's choice costs per worker.

#[path = "../harness/lab/src/bench/prompt.rs"]
mod prompt;

use std::hint::black_box;
use std::time::{Duration, Instant};

use pinroute::policy::api::Api;
use pinroute::policy::availability::RegistryOnly;
use pinroute::policy::config::Config;
use pinroute::policy::json::JsonObject;
use pinroute::policy::load::LoadTable;
use pinroute::policy::picker;
use pinroute::policy::pins::{self, HeaderHints, Pins};
use pinroute::policy::prefix::PromptPrefix;
use pinroute::policy::resolve::{PromptFacts, Resolver};
use pinroute::policy::rewrite::{self, BodyEdit, DecodeBody};
use pinroute::policy::select::{Affinity, Choice};

const DEFAULT_SIZES: [usize; 3] = [1024, 32 * 1024, 256 * 1024];
const DEFAULT_BUDGET: Duration = Duration::from_millis(300);
/// Each measurement is the median of this many timed batches.
const BATCHES: usize = 5;

const REGISTRY: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000", "dp_size": 1},
    {"id": 102, "role": "prefill", "address": "10.0.0.12:8000", "dp_size": 1},
    {"id": 201, "role": "decode", "address": "10.0.0.21:8000", "dp_size": 1},
    {"id": 202, "role": "decode", "address": "10.0.0.22:8000", "dp_size": 2}
]}"#;

/// What a sim prefill worker answers (the part the filter reads).
const PREFILL_RESPONSE: &str = r#"{"id":"cmpl-bench","object":"text_completion","created":1,"model":"sim-model","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":180,"total_tokens":181,"completion_tokens":1},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"sim-101-0","remote_block_ids":[8,9,10,11,12,13,14,15],"remote_request_id":"kv-sim101-1-1","remote_host":"127.0.0.1","remote_port":8101,"tp_size":1}}"#;

const HEADERS: [(&str, &[u8]); 10] = [
    (":method", b"POST"),
    (":path", b"/v1/completions"),
    (":authority", b"gateway:10000"),
    ("content-type", b"application/json"),
    ("content-length", b"262144"),
    ("user-agent", b"bench/1.0"),
    ("accept", b"text/event-stream"),
    ("x-request-id", b"bench-0-0"),
    ("x-dynamo-prefill-instance-id", b"101"),
    ("x-dynamo-worker-instance-id", b"201"),
];

/// A completion request of about `size` bytes: the benchmark's client body.
fn request_body(size: usize) -> String {
    let head = r#"{"model":"sim-model","prompt":""#;
    let tail = r#"","max_tokens":8,"stream":true}"#;
    let prompt = prompt::prompt_text(size.saturating_sub(tail.len()).saturating_sub(head.len()));
    format!("{head}{prompt}{tail}")
}

struct Options {
    sizes: Vec<usize>,
    budget: Duration,
    /// Workers per pool of the registry-size axis.
    pools: Vec<usize>,
}

const DEFAULT_POOLS: [usize; 4] = [1, 10, 100, 1000];
/// The body of the registry-size axis: long enough to be placed by its prefix.
const POOL_BODY_BYTES: usize = 8 * 1024;

fn numbers(flag: &str, list: &str) -> Result<Vec<usize>, String> {
    list.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|e| format!("{flag} {s:?}: {e}"))
        })
        .collect()
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        sizes: DEFAULT_SIZES.to_vec(),
        budget: DEFAULT_BUDGET,
        pools: DEFAULT_POOLS.to_vec(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--sizes" => {
                let list = args.next().ok_or("--sizes needs a value")?;
                options.sizes = numbers("--sizes", &list)?;
            }
            "--pools" => {
                let list = args.next().ok_or("--pools needs a value")?;
                options.pools = numbers("--pools", &list)?;
            }
            "--budget-ms" => {
                let ms = args.next().ok_or("--budget-ms needs a value")?;
                let ms = ms
                    .parse::<u64>()
                    .map_err(|e| format!("--budget-ms {ms:?}: {e}"))?;
                options.budget = Duration::from_millis(ms);
            }
            _ => {} // `cargo bench` passes `--bench`.
        }
    }
    Ok(options)
}

/// Nanoseconds per call of `f`: the median of [`BATCHES`] batches sized to fill `budget`.
fn measure<F: FnMut()>(budget: Duration, mut f: F) -> (f64, u64) {
    let per_batch = budget / BATCHES as u32;
    let mut iterations: u64 = 1;
    loop {
        let started = Instant::now();
        (0..iterations).for_each(|_| f());
        let elapsed = started.elapsed();
        if elapsed >= per_batch / 10 || iterations >= 1 << 30 {
            let scale = per_batch.as_secs_f64() / elapsed.as_secs_f64().max(1e-9);
            iterations = ((iterations as f64 * scale) as u64).max(1);
            break;
        }
        iterations *= 10;
    }
    let mut batches: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let started = Instant::now();
            (0..iterations).for_each(|_| f());
            started.elapsed().as_nanos() as f64 / iterations as f64
        })
        .collect();
    batches.sort_by(f64::total_cmp);
    let median = batches.get(BATCHES / 2).copied().unwrap_or(f64::NAN);
    (median, iterations * BATCHES as u64)
}

fn report(stage: &str, body_bytes: usize, (ns, iterations): (f64, u64)) {
    println!(
        r#"{{"stage":"{stage}","body_bytes":{body_bytes},"ns_per_op":{ns:.1},"iterations":{iterations}}}"#
    );
}

fn header_hints() -> Result<HeaderHints, String> {
    pins::parse_headers(HEADERS.iter().copied()).map_err(|e| e.to_string())
}

/// Every stage of one request, as the filter runs them.
fn whole_request(
    config: &Config,
    body: &[u8],
    turn: u64,
) -> Result<(String, Option<BodyEdit>), String> {
    let hints = header_hints()?;
    let request = JsonObject::parse(body).map_err(|e| e.to_string())?;
    let body_pins = pins::parse_nvext(&request).map_err(|e| e.to_string())?;
    let route = resolver(config, turn)
        .resolve(&hints.pins.or(body_pins))
        .map_err(|e| e.to_string())?;
    let decode = DecodeBody::new(&request, body, &[]);
    let prefill = rewrite::prefill_body(Api::ChatCompletions, &request, body.len());
    let params = rewrite::prefill_kv_transfer_params(PREFILL_RESPONSE.as_bytes())
        .map_err(|e| e.to_string())?;
    black_box(route);
    Ok((prefill, decode.finish(params.as_deref())))
}

fn resolver(config: &Config, turn: u64) -> Resolver<'_, RegistryOnly> {
    Resolver {
        registry: &config.registry,
        settings: &config.settings,
        availability: RegistryOnly,
        choice: Choice::RoundRobin(turn),
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    }
}

/// Requests in flight as the filter reads them: a table of the 16 first workers of the
/// registry with 1 to 3 each (the others have none).
fn in_flight(config: &Config) -> LoadTable {
    let mut table = LoadTable::default();
    for worker in config.registry.workers().iter().take(16) {
        table.add(worker.id, 1 + i64::try_from(worker.id % 3).unwrap_or(0));
    }
    table
}

/// An unpinned request's choice of both workers by load alone.
fn by_load(config: &Config, loads: &LoadTable, turn: u64) -> Result<(), String> {
    let resolver = Resolver {
        registry: &config.registry,
        settings: &config.settings,
        availability: RegistryOnly,
        choice: Choice::LeastLoaded {
            rotation: turn,
            outstanding: loads,
        },
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    };
    let route = resolver
        .resolve(&Pins::default())
        .map_err(|e| e.to_string())?;
    black_box(route);
    Ok(())
}

/// The same request's choice by prefix affinity, hashing its prompt as the filter does.
fn by_affinity(
    config: &Config,
    loads: &LoadTable,
    request: &JsonObject<'_>,
    turn: u64,
) -> Result<(), String> {
    let settings = &config.settings;
    let raw = Api::Completions.prompt(request);
    let raw = raw.as_ref();
    let prefix = if raw.len() < settings.prefix_min_bytes {
        PromptPrefix::unhashed(raw.len())
    } else {
        PromptPrefix::new(raw, settings.prefix_affinity_bytes)
    };
    let resolver = Resolver {
        registry: &config.registry,
        settings,
        availability: RegistryOnly,
        choice: Choice::Prefix(Affinity {
            depths: prefix.depths(settings.prefix_min_bytes),
            remembered: &[],
            busy: settings.busy(),
            rotation: turn,
            outstanding: loads,
            draw_key: prefix
                .depths(settings.prefix_min_bytes)
                .last()
                .copied()
                .unwrap_or(0),
        }),
        prompt: PromptFacts {
            bytes: raw.len(),
            last_turn: None,
        },
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    };
    let route = resolver
        .resolve(&Pins::default())
        .map_err(|e| e.to_string())?;
    black_box(route);
    Ok(())
}

fn bench_size(config: &Config, size: usize, budget: Duration) -> Result<(), String> {
    let body = request_body(size);
    let bytes = body.as_bytes();
    let request = JsonObject::parse(bytes).map_err(|e| e.to_string())?;
    let pins: Pins = header_hints()?.pins;
    let params = rewrite::prefill_kv_transfer_params(PREFILL_RESPONSE.as_bytes())
        .map_err(|e| e.to_string())?;
    whole_request(config, bytes, 0)?;
    let len = bytes.len();
    report(
        "headers",
        len,
        measure(budget, || drop(black_box(header_hints()))),
    );
    report(
        "parse",
        len,
        measure(budget, || {
            let parsed = JsonObject::parse(black_box(bytes));
            drop(black_box(
                parsed.map(|object| pins::parse_nvext(&object).is_ok()),
            ));
        }),
    );
    let mut turn = 0u64;
    report(
        "resolve",
        len,
        measure(budget, || {
            turn = turn.wrapping_add(1);
            drop(black_box(resolver(config, turn).resolve(black_box(&pins))));
        }),
    );
    report(
        "prefill_body",
        len,
        measure(budget, || {
            drop(black_box(rewrite::prefill_body(
                Api::ChatCompletions,
                &request,
                len,
            )))
        }),
    );
    report(
        "decode_body",
        len,
        measure(budget, || {
            drop(black_box(
                DecodeBody::new(&request, bytes, &[]).finish(params.as_deref()),
            ));
        }),
    );
    report(
        "prefill_response",
        len,
        measure(budget, || {
            drop(black_box(rewrite::prefill_kv_transfer_params(black_box(
                PREFILL_RESPONSE.as_bytes(),
            ))));
        }),
    );
    report(
        "total",
        len,
        measure(budget, || {
            drop(black_box(whole_request(config, black_box(bytes), 1)))
        }),
    );
    let loads = in_flight(config);
    by_load(config, &loads, 0)?;
    report(
        "unpinned",
        len,
        measure(budget, || {
            turn = turn.wrapping_add(1);
            drop(black_box(by_load(config, &loads, turn)));
        }),
    );
    by_affinity(config, &loads, &request, 0)?;
    report(
        "affinity",
        len,
        measure(budget, || {
            turn = turn.wrapping_add(1);
            drop(black_box(by_affinity(
                config,
                &loads,
                black_box(&request),
                turn,
            )));
        }),
    );
    Ok(())
}

/// A registry of `per_pool` prefill and as many decode workers.
fn registry_of(per_pool: usize) -> Result<Config, String> {
    let worker = |role: &str, n: usize, subnet: usize| {
        let id = if role == "prefill" { n } else { 100_000 + n };
        let address = format!("10.{subnet}.{}.{}:8000", n / 250, n % 250 + 1);
        format!(r#"{{"id": {id}, "role": "{role}", "address": "{address}", "dp_size": 1}}"#)
    };
    let workers: Vec<String> = (1..=per_pool)
        .map(|n| worker("prefill", n, 1))
        .chain((1..=per_pool).map(|n| worker("decode", n, 2)))
        .collect();
    let json = format!(r#"{{"workers": [{}]}}"#, workers.join(","));
    Config::from_json(json.as_bytes()).map_err(|e| e.to_string())
}

/// An unpinned request's choice by load and by affinity on registries of every pool size.
fn bench_pools(pools: &[usize], size: usize, budget: Duration) -> Result<(), String> {
    let body = request_body(size);
    let request = JsonObject::parse(body.as_bytes()).map_err(|e| e.to_string())?;
    let mut turn = 0u64;
    for &per_pool in pools {
        let config = registry_of(per_pool)?;
        let loads = in_flight(&config);
        by_load(&config, &loads, 0)?;
        by_affinity(&config, &loads, &request, 0)?;
        report(
            &format!("unpinned {per_pool}+{per_pool}"),
            body.len(),
            measure(budget, || {
                turn = turn.wrapping_add(1);
                drop(black_box(by_load(&config, &loads, turn)));
            }),
        );
        report(
            &format!("affinity {per_pool}+{per_pool}"),
            body.len(),
            measure(budget, || {
                turn = turn.wrapping_add(1);
                drop(black_box(by_affinity(
                    &config,
                    &loads,
                    black_box(&request),
                    turn,
                )));
            }),
        );
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let options = options()?;
    let config = Config::from_json(REGISTRY.as_bytes()).map_err(|e| e.to_string())?;
    for size in &options.sizes {
        bench_size(&config, *size, options.budget)?;
    }
    bench_pools(&options.pools, POOL_BODY_BYTES, options.budget)
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("policy bench: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
