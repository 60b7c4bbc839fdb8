//! The soak's [`Workload`]: sends the mix through the gateway and judges every answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::chaos::{Outages, Progress};
use super::mix::{self, Planned};
use super::outcome::{Answer, Judgement, Timing, Verdict, judge};
use super::tally::Tally;
use crate::load::{
    ClientTls, Exchange, FailedExchange, Sample, StatusClass, VirtualUser, Workload,
};

/// State shared by the workload, the chaos and the report.
#[derive(Debug)]
pub struct Shared {
    /// When the load started: problems are reported in seconds since.
    pub epoch: Instant,
    pub progress: Progress,
    pub outages: Outages,
    pub tally: Tally,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            epoch: Instant::now(),
            progress: Progress::default(),
            outages: Outages::default(),
            tally: Tally::default(),
        }
    }
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new()
    }
}

pub struct SoakWorkload {
    pub gateway: SocketAddr,
    pub shared: Arc<Shared>,
    pub max_tokens: u32,
    /// A request with no complete answer after this long counts as unanswered.
    pub answer_timeout: Duration,
    /// How long after its restart a killed worker may still be out of service.
    pub aftermath: Duration,
    /// The sim workers' time per generated token (when a client leaves the decode stream).
    pub token_latency: Duration,
    /// TLS to the gateway; `None`: clear text.
    pub tls: Option<ClientTls>,
}

impl Workload for SoakWorkload {
    async fn call(&self, user: &mut VirtualUser, seq: u64) -> Sample {
        let planned = mix::plan(user.id, seq, self.max_tokens);
        self.shared.tally.sent(planned.kind);
        self.shared.progress.request_sent();
        let request_id = format!("soak-{}-{seq}", user.id);
        let request = planned.request(&request_id);
        let started = Instant::now();
        let sent = user
            .connections
            .exchange_keeping_head(self.gateway, request);
        let leaves_after = planned.leaves.map(|leave| leave.after(self.token_latency));
        let result = tokio::time::timeout(leaves_after.unwrap_or(self.answer_timeout), sent).await;
        let timing = Timing {
            started,
            ended: Instant::now(),
        };
        if result.is_err() {
            user.connections.reset();
        }
        let answer = match &result {
            Ok(Ok(exchange)) => Answer::Complete(exchange),
            Ok(Err(FailedExchange {
                head: Some((status, headers)),
                error,
            })) => Answer::Cut {
                status: *status,
                headers,
                error,
            },
            Ok(Err(FailedExchange { head: None, error })) => Answer::Failed(error),
            Err(_) if leaves_after.is_some() => Answer::Left,
            Err(_) => Answer::TimedOut(self.answer_timeout),
        };
        let mut verdict = judge(
            &planned,
            &answer,
            timing,
            &self.shared.outages,
            self.aftermath,
        );
        if let Some(problem) = &mut verdict.problem {
            let at = started
                .saturating_duration_since(self.shared.epoch)
                .as_secs_f64();
            *problem = format!("{request_id} at {at:.2} s: {problem}");
        }
        let sample = sample(&planned, &verdict, timing, &result);
        self.shared.tally.record(planned.kind, verdict, request_id);
        sample
    }

    fn label(&self, _seq: u64) -> &'static str {
        "soak"
    }

    fn client_tls(&self) -> Option<ClientTls> {
        self.tls.clone()
    }
}

type Outcome = Result<Result<Exchange, FailedExchange>, tokio::time::error::Elapsed>;

/// The load generator's record of the request: latencies count only answers as expected.
fn sample(planned: &Planned, verdict: &Verdict, timing: Timing, outcome: &Outcome) -> Sample {
    let label = planned.kind.label();
    let expected = verdict.judgement == Judgement::AsExpected;
    if let Ok(Ok(exchange)) = outcome {
        let mut sample =
            Sample::from_exchange(label, timing.started, exchange, verdict.problem.clone());
        sample.expected = expected;
        return sample;
    }
    let elapsed = timing.ended.saturating_duration_since(timing.started);
    let class = if outcome.is_err() {
        StatusClass::Timeout
    } else {
        StatusClass::Transport
    };
    Sample {
        label,
        class,
        first_byte: elapsed,
        last_byte: elapsed,
        expected,
        problem: verdict.problem.clone(),
    }
}
