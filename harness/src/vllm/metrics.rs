//! Reading counters from Prometheus text exposition.

/// The sum of every sample of the metric `name` (over all label sets), 0 when absent.
/// `name` is the exposed sample name, e.g. `vllm:external_prefix_cache_hits_total`.
pub fn counter_total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|line| sample_value(line, name))
        .sum()
}

/// The sum of the samples of `name` whose labels include `label` (e.g. `source="local_compute"`).
pub fn counter_where(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('{'))
                .and_then(|labels| labels.rsplit_once('}'))
                .is_some_and(|(labels, _)| labels.split(',').any(|l| l == label))
        })
        .filter_map(|line| sample_value(line, name))
        .sum()
}

fn sample_value(line: &str, name: &str) -> Option<f64> {
    let rest = line.strip_prefix(name)?;
    let value = match rest.strip_prefix('{') {
        Some(labelled) => labelled.rsplit_once('}')?.1,
        None if rest.starts_with(' ') => rest,
        None => return None,
    };
    value.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn sums_label_sets_and_ignores_look_alikes() {
        let text = "# HELP vllm:x_total help\n# TYPE vllm:x_total counter\n\
                    vllm:x_total{engine=\"0\",model_name=\"m\"} 64.0\n\
                    vllm:x_total{engine=\"1\",model_name=\"a}b\"} 32.0\n\
                    vllm:x_total_created{engine=\"0\"} 1.7e9\n\
                    vllm:xy_total 5\n";
        assert_eq!(counter_total(text, "vllm:x_total"), 96.0);
        assert_eq!(counter_total(text, "vllm:xy_total"), 5.0);
        assert_eq!(counter_total(text, "vllm:absent_total"), 0.0);
        assert_eq!(counter_where(text, "vllm:x_total", "engine=\"1\""), 32.0);
        assert_eq!(counter_where(text, "vllm:x_total", "engine=\"2\""), 0.0);
    }
}
