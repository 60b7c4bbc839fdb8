//! The benchmark's workers: one prefill (id 101) and one decode (id 201) sim worker, in a
//! child process of their own so that their CPU time is measured apart from the load
//! generator's and they do not share its tokio runtime; and the registries a gateway is
//! given over them ([`Workers`]): each sim as one worker, or as many, one per loopback alias.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use pinroute_harness::sim::{SimConfig, SimRole, SimWorker};

pub const PREFILL_ID: u64 = 101;
pub const DECODE_ID: u64 = 201;
/// The sim workers record every request (for tests); the benchmark forgets them this often
/// so that a long run does not hoard its 256 KB prompts.
const FORGET_REQUESTS_EVERY: Duration = Duration::from_millis(200);
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Aliased workers: the second octet of each role's `127.x.y.z` addresses, and the first id.
const PREFILL_ALIASES: (u8, u64) = (11, 100_000);
const DECODE_ALIASES: (u8, u64) = (12, 200_000);
/// Loopback aliases per third octet (`.1` to `.250`).
const ALIASES_PER_OCTET: u64 = 250;
/// The most aliased workers of each role.
const MAX_ALIASED: u64 = ALIASES_PER_OCTET * 256;

/// Where the two workers listen (the first line the child prints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimAddresses {
    pub prefill: SocketAddr,
    pub decode: SocketAddr,
}

/// The running child process; stopped when dropped.
pub struct SimProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    pub addresses: SimAddresses,
}

impl SimProcess {
    /// Starts `<this executable> bench --serve-sims` and waits for its addresses.
    /// With `every_address`, the sims listen on all addresses (for [`Workers::aliased`]).
    pub async fn start(
        token_latency: Duration,
        every_address: bool,
        log_path: &Path,
    ) -> Result<SimProcess> {
        let executable = std::env::current_exe().context("locating this executable")?;
        let log =
            File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut child = Command::new(executable)
            .args(["bench", "--serve-sims", "--token-latency-us"])
            .arg(token_latency.as_micros().to_string())
            .args(every_address.then_some("--sims-on-every-address"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting the sim worker process")?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .context("no stdout of the sim worker process")?;
        let reading = tokio::task::spawn_blocking(move || first_line(stdout));
        let line = match tokio::time::timeout(START_TIMEOUT, reading).await {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => Err(anyhow::Error::from(e)),
            Err(_) => Err(anyhow::anyhow!("no addresses within {START_TIMEOUT:?}")),
        };
        let mut process = SimProcess {
            child,
            stdin,
            addresses: placeholder_addresses(),
        };
        let line =
            line.with_context(|| format!("sim worker process (log: {})", log_path.display()))?;
        process.addresses =
            serde_json::from_str(&line).with_context(|| format!("sim addresses {line:?}"))?;
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// One worker of a registry: its id and the address the gateway dials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub id: u64,
    pub address: SocketAddr,
}

/// The workers a gateway is given, all served by the two sims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workers {
    pub prefill: Vec<Listed>,
    pub decode: Vec<Listed>,
}

impl Workers {
    /// Each sim as one worker ([`PREFILL_ID`], [`DECODE_ID`]) at its own address.
    pub fn one_each(sims: SimAddresses) -> Workers {
        Workers {
            prefill: vec![Listed {
                id: PREFILL_ID,
                address: sims.prefill,
            }],
            decode: vec![Listed {
                id: DECODE_ID,
                address: sims.decode,
            }],
        }
    }

    /// `count` prefill and `count` decode workers, each at a loopback alias of its sim
    /// (`127.11.y.z`, `127.12.y.z`, the sim's port): as many hosts and connections for a
    /// gateway as that many machines would be. The sims must listen on every address.
    pub fn aliased(sims: SimAddresses, count: u64) -> anyhow::Result<Workers> {
        check_alias_count(count)?;
        let role = |(octet, first_id): (u8, u64), port: u16| {
            (0..count)
                .map(|i| {
                    let (high, low) = (i / ALIASES_PER_OCTET, i % ALIASES_PER_OCTET + 1);
                    let ip = Ipv4Addr::new(127, octet, high as u8, low as u8);
                    Listed {
                        id: first_id + i,
                        address: SocketAddr::from((ip, port)),
                    }
                })
                .collect()
        };
        Ok(Workers {
            prefill: role(PREFILL_ALIASES, sims.prefill.port()),
            decode: role(DECODE_ALIASES, sims.decode.port()),
        })
    }

    /// The first worker of each role: the one address a single-worker proxy is given.
    pub fn first(&self) -> SimAddresses {
        let first = |listed: &[Listed], fallback| listed.first().map_or(fallback, |l| l.address);
        let none = placeholder_addresses();
        SimAddresses {
            prefill: first(&self.prefill, none.prefill),
            decode: first(&self.decode, none.decode),
        }
    }
}

/// Whether [`Workers::aliased`] can give `count` workers of each role.
pub fn check_alias_count(count: u64) -> anyhow::Result<()> {
    if !(1..=MAX_ALIASED).contains(&count) {
        bail!("{count} workers of each role: expected 1 to {MAX_ALIASED}");
    }
    Ok(())
}

fn placeholder_addresses() -> SimAddresses {
    let none = SocketAddr::from(([127, 0, 0, 1], 0));
    SimAddresses {
        prefill: none,
        decode: none,
    }
}

fn first_line(stdout: std::process::ChildStdout) -> Result<String> {
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("reading the sim worker process")?;
    if line.trim().is_empty() {
        bail!("the sim worker process exited without printing its addresses");
    }
    Ok(line)
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let pid = self.child.id();
        if let Err(e) = self.child.kill() {
            log::debug!("stopping the sim worker process {pid}: {e}");
        }
        if let Err(e) = self.child.wait() {
            log::warn!("reaping the sim worker process {pid}: {e}");
        }
    }
}

/// The child side: serves both workers until its stdin closes (the parent went away). Each
/// listens on loopback, or with `every_address` on every address; each is reported at
/// `127.0.0.1` and its port.
pub async fn serve_sims(token_latency: Duration, every_address: bool) -> Result<()> {
    let any = match every_address {
        true => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        false => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
    };
    let on_loopback = |addr: SocketAddr| SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()));
    let prefill = SimConfig::new(PREFILL_ID, SimRole::Prefill).with_token_latency(token_latency);
    let decode = SimConfig::new(DECODE_ID, SimRole::Decode).with_token_latency(token_latency);
    let prefill = SimWorker::start(prefill, any).await?;
    let decode = SimWorker::start(decode, any).await?;
    let addresses = SimAddresses {
        prefill: on_loopback(prefill.addr()),
        decode: on_loopback(decode.addr()),
    };
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", serde_json::to_string(&addresses)?)
        .context("printing the sim addresses")?;
    stdout.flush().context("printing the sim addresses")?;
    let forget = tokio::spawn(async move {
        loop {
            tokio::time::sleep(FORGET_REQUESTS_EVERY).await;
            prefill.clear_requests();
            decode.clear_requests();
        }
    });
    let mut stdin = tokio::io::stdin();
    let mut buffer = [0u8; 64];
    while stdin
        .read(&mut buffer)
        .await
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
    forget.abort();
    Ok(())
}
