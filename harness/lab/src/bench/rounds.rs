//! Runs repeated in rounds: the difference of two processes' CPU moves by up to 0.06 ms per
//! request between single runs on this machine, so a cell run several times keeps its
//! median run by CPU per request, with every round's CPU beside it.

/// Of `runs`, one per cell (`same_cell`), in the order cells first ran: the median run by
/// `cpu` (the upper one of an even count), with what `merge` takes from all of the cell's
/// runs, given in the order they ran (every round's CPU, and every failure: a round that is
/// not the median still counts).
pub fn medians<T: Clone>(
    runs: Vec<T>,
    same_cell: impl Fn(&T, &T) -> bool,
    cpu: impl Fn(&T) -> Option<f64>,
    merge: impl Fn(&mut T, &[T]),
) -> Vec<T> {
    let mut cells: Vec<Vec<T>> = Vec::new();
    for run in runs {
        match cells
            .iter_mut()
            .find(|cell| cell.first().is_some_and(|c| same_cell(c, &run)))
        {
            Some(cell) => cell.push(run),
            None => cells.push(vec![run]),
        }
    }
    cells
        .into_iter()
        .filter_map(|cell| {
            let mut by_cpu: Vec<&T> = cell.iter().collect();
            by_cpu.sort_by(|a, b| cpu(a).unwrap_or(0.0).total_cmp(&cpu(b).unwrap_or(0.0)));
            let mut median = (*by_cpu.get(by_cpu.len() / 2)?).clone();
            merge(&mut median, &cell);
            Some(median)
        })
        .collect()
}

/// The rounds' CPU per request, lowest to highest, when there were several.
pub fn spread(rounds: &[f64]) -> Option<String> {
    let low = rounds.iter().copied().reduce(f64::min)?;
    let high = rounds.iter().copied().reduce(f64::max)?;
    (rounds.len() > 1).then(|| format!("{low:.3}–{high:.3}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cell_keeps_its_median_and_an_even_count_the_upper_one() {
        let runs = vec![
            ("a", 0.30),
            ("b", 0.10),
            ("a", 0.20),
            ("b", 0.40),
            ("a", 0.25),
        ];
        let kept = medians(
            runs.into_iter()
                .map(|(cell, cpu)| (cell, cpu, vec![]))
                .collect(),
            |x, y| x.0 == y.0,
            |run| Some(run.1),
            |median, cell| median.2 = cell.iter().map(|run| run.1).collect(),
        );
        assert_eq!(
            kept,
            vec![
                ("a", 0.25, vec![0.30, 0.20, 0.25]),
                ("b", 0.40, vec![0.10, 0.40])
            ]
        );
        assert_eq!(spread(&kept[0].2).as_deref(), Some("0.200–0.300"));
        assert_eq!(spread(&[0.2]), None);
    }
}
