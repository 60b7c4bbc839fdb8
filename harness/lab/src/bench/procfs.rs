//! CPU time and peak memory of processes, and how busy the machine is, from `/proc`.

use std::fs;

use anyhow::{Context, Result, bail};

/// `/proc` counts CPU time in clock ticks of `USER_HZ`, 100 on every Linux architecture.
pub const TICKS_PER_SECOND: f64 = 100.0;

/// User plus system CPU ticks of a process, all its threads.
pub fn process_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    stat_ticks(&text).with_context(|| format!("parsing {path}"))
}

/// This process's CPU ticks.
pub fn own_ticks() -> Result<u64> {
    process_ticks(std::process::id())
}

/// `utime + stime` from a `/proc/<pid>/stat` line (fields 14 and 15; the command name in
/// field 2 may contain spaces and parentheses, so fields are counted from its last `)`).
fn stat_ticks(stat: &str) -> Result<u64> {
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("no `)` in stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |index: usize| -> Result<u64> {
        let text = fields
            .get(index)
            .with_context(|| format!("stat has no field {}", index + 3))?;
        text.parse()
            .with_context(|| format!("stat field {} is {text:?}", index + 3))
    };
    Ok(field(11)? + field(12)?)
}

/// Peak resident memory (`VmHWM`) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status_kib(&text, "VmHWM:").with_context(|| format!("no VmHWM in {path}"))
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(key))?;
    line.trim_start_matches(key)
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Resets a process's peak resident memory to its current size (`clear_refs` 5), so the
/// next reading of `VmHWM` is the peak since now.
pub fn reset_peak_rss(pid: u32) -> Result<()> {
    let path = format!("/proc/{pid}/clear_refs");
    fs::write(&path, "5").with_context(|| format!("writing 5 to {path}"))
}

/// Busy and total CPU ticks of the whole machine, all CPUs (`/proc/stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineTicks {
    pub busy: u64,
    pub total: u64,
}

pub fn machine_ticks() -> Result<MachineTicks> {
    let text = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse_machine_ticks(&text)
}

fn parse_machine_ticks(text: &str) -> Result<MachineTicks> {
    let Some(line) = text.lines().find(|line| line.starts_with("cpu ")) else {
        bail!("/proc/stat has no `cpu` line");
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is included in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Ok(MachineTicks {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> Result<[f64; 3]> {
    let text = fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    let mut values = text
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap_or(f64::NAN));
    Ok([
        values.next().unwrap_or(f64::NAN),
        values.next().unwrap_or(f64::NAN),
        values.next().unwrap_or(f64::NAN),
    ])
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The processor's model as the kernel names it (`/proc/cpuinfo`), empty if unknown: CPU
/// figures in ms compare only between runs on the same model.
pub fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .map(|text| model_name(&text))
        .unwrap_or_default()
}

/// `2 CPUs (AMD EPYC)`, or `2 CPUs` when the model is unknown.
pub fn machine(cpus: usize, model: &str) -> String {
    match model {
        "" => format!("{cpus} CPUs"),
        model => format!("{cpus} CPUs ({model})"),
    }
}

fn model_name(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(key, _)| key.trim() == "model name")
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_model_is_the_first_model_name() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9R14\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(model_name(cpuinfo), "AMD EPYC 9R14");
        assert_eq!(model_name("processor\t: 0\n"), "");
        assert_eq!(machine(2, "AMD EPYC"), "2 CPUs (AMD EPYC)");
        assert_eq!(machine(2, ""), "2 CPUs");
    }

    #[test]
    fn reads_ticks_past_a_tricky_command_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0 1 2 3";
        assert_eq!(stat_ticks(stat).unwrap(), 280);
        assert!(own_ticks().is_ok());
    }

    #[test]
    fn reads_peak_memory() {
        assert_eq!(
            status_kib("Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 99 kB\n", "VmHWM:"),
            Some(1234)
        );
        let pid = std::process::id();
        assert!(peak_rss_kib(pid).unwrap() > 0);
        reset_peak_rss(pid).unwrap();
    }

    #[test]
    fn reads_machine_ticks() {
        let ticks = parse_machine_ticks("cpu  10 1 5 100 4 0 2 0 0 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!(
            ticks,
            MachineTicks {
                busy: 18,
                total: 122
            }
        );
        assert!(machine_ticks().unwrap().total > 0);
        assert_eq!(load_average().unwrap().len(), 3);
    }
}
